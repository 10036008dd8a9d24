"""Engine: cached prefill/decode equal the plain forward; sampling; capacity."""

import pytest
import torch

from leyline_sdk.errors import CapacityExceeded
from leyline_sdk.protocol import GenerateRequest, SessionCreate
from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.runtime import Runtime, RuntimeConfig

from helpers import agent_history, fp32_diff


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=4096))


@pytest.mark.parametrize("chunk", [37, 2048])
def test_chunked_prefill_and_decode_equal_forward(rt, chunk):
    n = 300
    tokens = torch.randint(0, rt.model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(chunk))
    full = rt.model(tokens[None])[0]
    table = BlockTable(rt.pool.block_size)
    rt.blocks.reserve(table, n)
    rt.engine.prefill_chunk = chunk
    try:
        prefix = rt.engine.prefill(table, tokens[:250].tolist(), 0, logits="all")
        steps = [rt.engine.prefill(table, [int(t)], 250 + i) for i, t in enumerate(tokens[250:])]
    finally:
        rt.engine.prefill_chunk = 2048
        rt.blocks.release(table)
    # one-token steps take the decode attention path (other sums, other order): seen up to 1.1e-5 of
    # the logits' size with two threads; a wrong row or position is off by O(1)
    assert fp32_diff(prefix, full[:250]) <= 3e-5
    assert fp32_diff(torch.stack(steps), full[250:]) <= 3e-5


def test_generation_is_seeded_and_reports_logprobs(rt):
    outs = []
    for _ in range(2):
        sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
        req = GenerateRequest(max_tokens=6, temperature=0.9, top_p=0.9, seed=7, logprobs=True, top_logprobs=3)
        outs.append(rt.generate(sid, req))
        rt.delete_session(sid)
    a, b = outs
    assert a.message == b.message and [x.logprob for x in a.logprobs] == [x.logprob for x in b.logprobs]
    assert len(a.logprobs) == a.usage.completion_tokens and all(len(x.top_logprobs) == 3 for x in a.logprobs)
    assert a.usage.cached_tokens == a.usage.prompt_tokens - 1


def test_generated_message_tokens_are_in_the_cache(rt):
    sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
    rt.generate(sid, GenerateRequest(max_tokens=5, stop=["e"]))
    s = rt._sessions[("default", sid)]
    assert s.table.capacity >= s.num_tokens
    full = rt.model(torch.tensor([s.tokens]))[0, -1]
    table_rows = BlockTable(rt.pool.block_size, list(s.table.blocks))
    added = rt.blocks.reserve(table_rows, s.num_tokens + 1)
    nxt = rt.engine.prefill(table_rows, [s.tokens[-1]], s.num_tokens - 1)  # rewrite last row, read the rest
    assert (nxt - full).abs().max().item() <= 1e-4
    rt.blocks.release(added)
    rt.delete_session(sid)


def test_block_pool_capacity_error():
    rt = Runtime(RuntimeConfig(max_cache_tokens=32, block_size=16))
    got = rt.blocks.take(2)
    assert len(got) == 2 and rt.blocks.num_free == 0
    with pytest.raises(CapacityExceeded, match="blocks"):
        rt.blocks.take(1)
    rt.blocks.release(got)
    assert rt.blocks.num_free == 2


def test_min_tokens_holds_back_the_end_of_the_message(rt):
    sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
    free = rt.generate(sid, GenerateRequest(max_tokens=64)).usage.completion_tokens
    rt.delete_session(sid)
    assert free < 64  # the model ends this reply by itself ...
    sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
    held = rt.generate(sid, GenerateRequest(max_tokens=free + 6, min_tokens=free + 6))
    rt.delete_session(sid)
    assert held.usage.completion_tokens == free + 6 and held.finish_reason == "length"  # ... but not before min_tokens


def test_a_stop_string_before_half_a_character_stops_at_its_token():
    from leyline_runtime.engine.generation import GenerationState
    from leyline_sdk.protocol import SamplingParams

    pieces = [b"ab", b"STOP\xe6", b"\x97\xa5"]  # token 1 ends with the first byte of a character
    decode = lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
    state = GenerationState.create(SamplingParams(stop=["STOP"], max_tokens=10), set(), 0, 100, decode)
    choose = lambda k: torch.nn.functional.one_hot(torch.tensor(k), 3).float()  # noqa: E731
    assert state.step(choose(0)) == (0, None)
    token, done = state.step(choose(1))
    assert token == 1 and done is not None and done.stop_string == "STOP" and done.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [5e-324, 1e-40])
def test_a_vanishing_temperature_samples_its_limit_greedy(rt, temperature):
    """A temperature so small that logits / temperature overflow (schemathesis sent 5e-324 to
    /v1/chat/completions: a 500, "probability tensor contains inf") decodes greedily."""
    sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
    greedy = rt.generate(sid, GenerateRequest(max_tokens=4, temperature=0.0))
    rt.delete_session(sid)
    sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
    tiny = rt.generate(sid, GenerateRequest(max_tokens=4, temperature=temperature, top_p=0.5, seed=1))
    rt.delete_session(sid)
    assert tiny.message == greedy.message
