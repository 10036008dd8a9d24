"""Where a session's rows live between its turns: blocks held in vLLM's own paged cache, a host tier
only for released holds, and what happens once a hold is gone (a real ``vllm serve``).

The folder's server has a host tier (0.25 GiB) and moves the holds of ``SPILL_SESSIONS`` there as soon
as they are made; this module's own server has a small pool (so pressure is reachable), a 30 s hold
TTL and no host tier.
"""

from __future__ import annotations

import re
import time
import uuid

import httpx
import numpy as np
import pytest

from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer, has_amx, vllm_on_cpu
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Message, Span

from conftest import SPILL_SESSIONS
from leyline_bench.vllm.checks import REPLACEMENT, edited, history, rows
from test_vllm_directives import sid

POOL_TOKENS = 2048  # the small pool: 4 sessions' holds fill most of it
MAX_MODEL_LEN = 1024
HOLD_TTL_S = 30


def metric(base_url: str, name: str, **labels) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}(?:_total)?(?:\{{{re.escape(want)}\}})? ([0-9.e+-]+)$" if want else \
        rf"^{name}(?:_total)? ([0-9.e+-]+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name}{labels} not on /metrics"
    return float(found.group(1))


def amortize(client: LeylineClient, session_id: str, messages: list[Message]):
    return client.apply(session_id, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT,
                                               mode="amortize")]).outcomes[0]


def test_a_held_block_splice_equals_a_host_tier_splice_bit_for_bit(base_url, tol):
    """One history, one edit: a session whose snapshot stayed in the paged cache and one whose snapshot
    was released to the host tier load and rotate the very same rows.

    Bit for bit where the rows were carried (the prefix kept, the rows rotated) from equal source rows.
    Rows vLLM computed (the edit's recomputed window; before it, the row of each session's generated
    token) may part by the batch shape they were computed in (seen on the AMX Xeon in bf16: 0.047 in
    one CI run, 0 in the next), so they are held to the two-prefills bound."""
    old = history(tag=uuid.uuid4().hex[:12])
    held, spilled = sid("held"), SPILL_SESSIONS[0]
    with LeylineClient(base_url, timeout=600) as client:
        for s in (held, spilled):
            client.create_session(old, session_id=s)
        before = {layer: (rows(base_url, held, layer), rows(base_url, spilled, layer)) for layer in (0, 1)}
        plain_completion(base_url, 4)  # an engine step: the worker copies the spill session's hold out
        host_loads = metric(base_url, "leyline_host_tier_loads")
        outcomes = [amortize(client, s, old) for s in (held, spilled)]
        # the spill session's edit was served from the host tier, the other from its held blocks
        assert metric(base_url, "leyline_host_tier_loads") >= host_loads + 1
        assert metric(base_url, "leyline_host_tier_bytes") > 0 and metric(base_url, "leyline_held_blocks") > 0
        for o in outcomes:
            assert o.applied_mode == "amortize" and o.fallback_reason is None, o
            assert o.rotated_tokens > 0
        assert outcomes[0] == outcomes[1]
        carried = _carried_from(outcomes[0])
        for layer in (0, 1):
            a, b = rows(base_url, held, layer), rows(base_url, spilled, layer)
            assert a.shape == b.shape
            was_a, was_b = before[layer]
            same_source = np.zeros(len(a), dtype=bool)
            for new, old_row in carried(len(a)):
                same_source[new] = np.array_equal(was_a[old_row], was_b[old_row])
            assert same_source.sum() > len(a) // 2, (layer, same_source.sum())  # most rows carried as they were
            assert np.array_equal(a[same_source], b[same_source]), (layer, np.nonzero((a != b).any(axis=1) & same_source))
            assert np.abs(a - b).max() <= tol.prefill_row * np.abs(a).max(), (layer, np.abs(a - b).max())
        assert metric(base_url, "leyline_hold_releases", reason="test_spill") >= 3
        dropped = metric(base_url, "leyline_hold_releases", reason="dropped")
        client.apply(held, [Directive(span=Span(start=1, end=2), mode="forget")])
        # the edit's request released the snapshot it superseded
        assert metric(base_url, "leyline_hold_releases", reason="dropped") >= dropped + 1
        client.delete_session(spilled)
        client.delete_session(held)


def _carried_from(outcome):
    """(new row, old row) of every row an amortize carried: the prefix it kept, then the rows it rotated
    (moved by the edit's delta); the recomputed window between them is the engine's."""
    first_rotated = outcome.reused_tokens + outcome.recomputed_tokens

    def pairs(n_rows: int):
        yield from ((i, i) for i in range(outcome.reused_tokens))
        yield from ((i, i - outcome.delta) for i in range(first_rotated, n_rows))
    return pairs


@pytest.fixture(scope="module")
def small_pool(checkpoint, tmp_path_factory):
    """No host tier, a 30 s TTL and a pool of 2048 tokens (+ vLLM's null block). The block size is the
    backend's (CPU MLA: 16 without AMX, any multiple of 32 with it, where the server asks for 32): the pool
    is counted in it, and the test reads the size the server reports."""
    env = {"LEYLINE_VLLM_HOLD_TTL_S": str(HOLD_TTL_S), "LEYLINE_VLLM_HOLD_FRACTION": "1",
           "LEYLINE_VLLM_HOST_TIER_GIB": "0", "LEYLINE_VLLM_DEBUG_ROUTES": "1"}
    block = 32 if vllm_on_cpu() and has_amx() else 16  # as serve_command asks for it
    extra = ["--num-gpu-blocks-override", str(POOL_TOKENS // block + 1)]
    with VllmServer(checkpoint, tmp_path_factory.mktemp("vllm-small-pool"), env=env, extra=extra,
                    max_model_len=MAX_MODEL_LEN) as srv:
        served = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', httpx.get(f"{srv.base_url}/metrics").text)
        assert served and int(served.group(1)) == block, f"served blocks of {served and served.group(1)}, counted {block}"
        srv.block = block
        yield srv


def plain_prompt(base_url: str, tokens: int) -> str:
    """Text of ``tokens`` tokens or a few more (measured with vLLM's /tokenize)."""
    words = max(1, tokens // 4)
    for _ in range(20):
        prompt = " ".join(f"word{i}" for i in range(words))
        r = httpx.post(f"{base_url}/tokenize", json={"model": SERVED_MODEL_NAME, "prompt": prompt}, timeout=60)
        r.raise_for_status()
        count = r.json()["count"]
        if count >= tokens:
            return prompt
        words += max(1, (tokens - count) // 5)
    raise AssertionError(f"no prompt of {tokens} tokens")


def plain_completion(base_url: str, tokens: int) -> dict:
    """A request without Leyline parameters (vLLM's own completions route) of at least ``tokens`` tokens."""
    prompt = plain_prompt(base_url, tokens)
    r = httpx.post(f"{base_url}/v1/completions", json={"model": SERVED_MODEL_NAME, "prompt": prompt,
                                                         "max_tokens": 2, "temperature": 0}, timeout=300)
    r.raise_for_status()
    return r.json()


def test_pressure_releases_the_oldest_holds_so_new_requests_get_blocks(small_pool):
    base_url, block = small_pool.base_url, small_pool.block
    started = time.monotonic()
    with LeylineClient(base_url, timeout=300) as client:
        sessions = [sid(f"p{i}") for i in range(4)]
        # each its own text: with vLLM's prefix cache on, sessions of one text would share their blocks
        histories = {s: history(6, tag=s) for s in sessions}
        for s in sessions:
            info = client.create_session(histories[s], session_id=s)
        per_session = -(-info.num_tokens // block)
        held = int(metric(base_url, "leyline_held_blocks"))
        assert held == 4 * per_session, (held, per_session)  # no release yet
        free = POOL_TOKENS // block - held
        # a plain request needing more blocks than are free: pressure must release holds, oldest first
        out = plain_completion(base_url, min(MAX_MODEL_LEN - 8, (free + per_session // 2) * block))
        assert out["usage"]["prompt_tokens"] > free * block, (out["usage"], free)
        # the oldest session's hold is gone: its edit falls back, named, and computes the rows
        outcome = amortize(client, sessions[0], histories[sessions[0]])
        assert outcome.applied_mode == "forget", outcome
        assert outcome.fallback_reason and outcome.fallback_reason.startswith("hold_released: pressure")
        assert outcome.recomputed_tokens > outcome.token_start
        assert metric(base_url, "leyline_hold_releases", reason="pressure") >= 1
        assert metric(base_url, "leyline_load_fallbacks", reason="hold_released") >= 1
        assert metric(base_url, "leyline_host_tier_bytes") == 0  # no host tier: never a host copy
        # the session is whole again: its next edit amortizes from its new hold
        again = amortize(client, sessions[0], edited(histories[sessions[0]], 3, REPLACEMENT))
        assert again.fallback_reason is None or not again.fallback_reason.startswith("hold_released")
        for s in sessions:
            client.delete_session(s)
    assert time.monotonic() - started < HOLD_TTL_S, "too slow to tell pressure from the TTL on this machine"


def test_ttl_releases_an_idle_hold(small_pool):
    base_url = small_pool.base_url
    with LeylineClient(base_url, timeout=300) as client:
        s = sid("idle")
        client.create_session(history(6, tag=s), session_id=s)
        time.sleep(HOLD_TTL_S + 1)
        plain_completion(base_url, 8)  # any request steps the engine, which checks the TTL
        outcome = amortize(client, s, history(6, tag=s))
        assert outcome.fallback_reason and outcome.fallback_reason.startswith("hold_released: ttl"), outcome
        assert metric(base_url, "leyline_hold_releases", reason="ttl") >= 1
        assert metric(base_url, "leyline_host_tier_bytes") == 0
        client.delete_session(s)
