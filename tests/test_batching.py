"""Sessions decode together: batched results equal solo results; cancellation stays local."""

from __future__ import annotations

import threading

import pytest
import torch

from leyline_sdk.protocol import GenerateRequest, Message, SessionCreate
from leyline_runtime.runtime import Runtime, RuntimeConfig

from helpers import agent_history, fp32_diff

SESSIONS = 16


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=65536))


def histories() -> list[list[Message]]:
    """16 histories of different lengths (a few hundred to about two thousand tokens)."""
    return [agent_history(long_output_lines=2 + 3 * i) + [Message(role="user", content=f"Question {i}?" * (1 + i % 3))]
            for i in range(SESSIONS)]


def request() -> GenerateRequest:
    return GenerateRequest(max_tokens=12, temperature=0.0, logprobs=True, top_logprobs=2)


def generate_all(rt, sids: list[str], together: bool):
    results: dict[str, object] = {}
    if not together:
        for sid in sids:
            results[sid] = rt.generate(sid, request())
        return results
    barrier = threading.Barrier(len(sids))

    def one(sid: str) -> None:
        barrier.wait()
        results[sid] = rt.generate(sid, request())

    threads = [threading.Thread(target=one, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_batched_greedy_tokens_and_logprobs_equal_solo(rt, monkeypatch):
    solo_ids = [rt.create_session(SessionCreate(messages=h)).session_id for h in histories()]
    batched_ids = [rt.create_session(SessionCreate(messages=h)).session_id for h in histories()]
    solo = generate_all(rt, solo_ids, together=False)

    widest = []  # generations decoding in each step
    run = rt.engine.runner.run

    def observe(chunks):
        widest.append(sum(seq.generation is not None for seq, _ in chunks))
        return run(chunks)

    monkeypatch.setattr(rt.engine.runner, "run", observe)
    batched = generate_all(rt, batched_ids, together=True)
    assert max(widest) >= SESSIONS // 2, widest  # they really shared steps

    for a, b in zip(solo_ids, batched_ids):
        x, y = solo[a], batched[b]
        assert x.message == y.message
        assert x.usage.completion_tokens == y.usage.completion_tokens
        assert [t.token for t in x.logprobs] == [t.token for t in y.logprobs]
        lp_x = torch.tensor([[t.logprob] + [p.logprob for p in t.top_logprobs] for t in x.logprobs])
        lp_y = torch.tensor([[t.logprob] + [p.logprob for p in t.top_logprobs] for t in y.logprobs])
        # The same fp32 sums in another order: log-softmax errors scale with the logits' spread, which
        # the step's largest top logprob shows (a sampled -0.92 came 1.3e-5 apart beside a top-5 of -14;
        # on the sharper current model a top-5 of -4.8 came 7.3e-5 apart: 1.5e-5 of it). Which steps
        # share a batch depends on thread timing, so the bound keeps 2x room over the worst seen.
        scale = lp_x.abs().amax(dim=1).clamp(min=1.0)
        assert ((lp_x - lp_y).abs().amax(dim=1) / scale).max().item() <= 3e-5
    for sid in solo_ids + batched_ids:
        rt.delete_session(sid)


def test_gathered_decode_attention_equals_reading_rows_in_place(rt, monkeypatch):
    """Decode steps batched over one padded gather of their rows == each over its rows in place."""
    from leyline_runtime.kv_cache import BlockTable, ensure_capacity
    from leyline_runtime.model import batch

    pool, gen = rt.pool, torch.Generator().manual_seed(0)
    lengths = [3, 40, 17, 200, 129, 64]
    tables = []
    for n in lengths:
        tables.append(BlockTable(pool.block_size))
        ensure_capacity(pool, tables[-1], n)
    try:
        for t, n in zip(tables, lengths):
            pool.rows[:, t.rows(0, n)] = torch.randn(pool.rows.shape[0], n, pool.rows.shape[2], generator=gen)
        ids = torch.randint(0, rt.model.config.vocab_size, (len(lengths),), generator=gen)

        def logits():
            segments = [(n - 1, 1, t.extents(n)) for t, n in zip(tables, lengths)]
            layout = batch.BatchLayout.build(segments, list(range(len(lengths))), pool.rows.device)
            return layout.decode_gather is not None, rt.model.forward_batch(ids, pool.rows, layout)

        gathered, a = logits()
        monkeypatch.setattr(batch, "MAX_DECODE_GATHER_ROWS", 0)
        in_place, b = logits()
        assert gathered and not in_place
        assert fp32_diff(a, b) <= 1e-5
    finally:
        for t in tables:
            pool.free(t.blocks)


def test_a_cancelled_generation_stops_alone_and_leaves_its_session_unchanged(rt):
    sids = [rt.create_session(SessionCreate(messages=h)).session_id for h in histories()[:3]]
    before = rt.get_session(sids[0], include_messages=True)
    free_before = rt.pool.num_free
    seen: list[int] = []

    class Gone(Exception):
        pass

    def disconnect(token: int) -> None:
        seen.append(token)
        if len(seen) == 2:
            raise Gone()

    errors: list[BaseException] = []
    long = GenerateRequest(max_tokens=40, temperature=0.0, stop=[])

    def cancelled() -> None:
        try:
            rt.generate(sids[0], long, on_token=disconnect)
        except Gone as exc:
            errors.append(exc)

    others = {}
    threads = [threading.Thread(target=cancelled)] + [
        threading.Thread(target=lambda s=s: others.__setitem__(s, rt.generate(s, request()))) for s in sids[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and len(seen) == 2
    assert rt.get_session(sids[0], include_messages=True) == before
    assert all(r.usage.completion_tokens >= 1 for r in others.values()) and len(others) == 2
    for sid in sids[1:]:
        rt.delete_session(sid)
    rt.delete_session(sids[0])
    assert rt.pool.num_free >= free_before


def test_work_on_one_session_never_blocks_another(rt):
    busy, free = (rt.create_session(SessionCreate(messages=h)).session_id for h in histories()[:2])
    done = threading.Event()

    def generate_on_the_other() -> None:
        rt.generate(free, GenerateRequest(max_tokens=3, temperature=0.0))
        done.set()

    # Hold the first session as a long directive batch or generation would.
    with rt._hold("default", busy):
        worker = threading.Thread(target=generate_on_the_other)
        worker.start()
        assert done.wait(timeout=300), "a generation waited for another session's work"
    worker.join()
    rt.delete_session(busy)
    rt.delete_session(free)
