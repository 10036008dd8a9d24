"""Directives executed inside vLLM's paged cache (a real ``vllm serve`` + Leyline's plugins).

References are vLLM itself: its own ``/v1/chat/completions`` (no session, no
plugin code on the path) for fresh prefills, and rows a fresh session saved
for layer-0 checks. Every test runs on two servers of the MLA test model, whatever the CPU
(:mod:`vllm_support`): fp32 without vLLM's prefix cache (what a CPU without AMX runs), and bf16 with it
(what an AMX CPU runs; forced on by the plugin's test hook where the CPU has no AMX).
"""

from __future__ import annotations

import math
import uuid

import httpx
import numpy as np
import pytest

from leyline_sdk import LeylineClient
from leyline_bench.vllm.checks import REPLACEMENT, edited, greedy, history, rows
from leyline_testkit.vllm_server import SERVED_MODEL_NAME
from leyline_sdk.protocol import Directive, Message, Span
from conftest import mla_server
from vllm_support import mla_configs, native_mla_config


@pytest.fixture(scope="module", params=[c.name for c in mla_configs()])
def server(request, checkpoint, tmp_path_factory):
    """The folder's server where vLLM picks this configuration on this CPU, a server of its own otherwise."""
    config = next(c for c in mla_configs() if c.name == request.param)
    if config.name == native_mla_config():
        yield request.getfixturevalue("native_server")
        return
    with mla_server(checkpoint, tmp_path_factory.mktemp(f"vllm-{config.name}"), config) as srv:
        print(f"\nvllm serve ({config.name}) started in {srv.startup_s:.0f} s at {srv.base_url}")
        yield srv


@pytest.fixture()
def client(base_url):
    with LeylineClient(base_url, timeout=600) as c:
        yield c


def sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def own_history() -> list[Message]:
    """A history no other test (or earlier run on a reused server) computed: what a test may see reused
    is then only what it computed itself (vLLM's prefix cache is on with AMX, and on every GPU)."""
    return history(tag=uuid.uuid4().hex[:12])


def fresh_reference(base_url: str, messages: list[Message], max_tokens: int = 6) -> dict:
    """vLLM's own chat endpoint (no session: the plugin only forwards) on the same history."""
    body = {"model": SERVED_MODEL_NAME, "messages": [m.model_dump(exclude_none=True) for m in messages],
            "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["logprobs"]["content"]


def assert_same_generation(got, reference, tol: float) -> None:
    assert_same_greedy([(t.token, t.logprob) for t in got.logprobs], reference, tol)


def assert_same_greedy(got: list[tuple[str, float]], reference: list[dict], tol: float) -> None:
    """Greedy ``(token, logprob)`` pairs equal the reference's (with its ``top_logprobs``), logprobs within
    ``tol``, up to a near tie: where the two part, the token taken must be one the reference ranks within
    ``2 * tol`` of its own choice (each side's logprobs carry up to ``tol`` of rounding), and nothing after
    it is compared (the continuations then legitimately differ). In bf16 rows loaded and extended are
    rounded otherwise than one prefill's: on the AMX Xeon a forget edit's 5th greedy token once took
    'ates' where the fresh prefill took '">' (the tiny random model's logits lie close)."""
    assert len(got) == len(reference), (got, reference)
    for i, ((token, logprob), want) in enumerate(zip(got, reference)):
        if token != want["token"]:
            ranked = {t["token"]: t["logprob"] for t in want.get("top_logprobs") or []}
            assert ranked.get(token, -math.inf) >= want["logprob"] - 2 * tol, (i, token, want)
            return
        assert abs(logprob - want["logprob"]) <= tol, (i, token, logprob, want["logprob"])


def test_forget_equals_vllm_fresh_prefill(client, base_url, tol, block):
    old = own_history()
    s = sid()
    client.create_session(old, session_id=s)
    result = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode="forget")])
    (outcome,) = result.outcomes
    assert outcome.applied_mode == "forget" and outcome.fallback_reason is None
    assert outcome.rotated_tokens == 0
    # the prefix before the span was loaded, not computed (whole blocks)
    prefix_blocks = outcome.token_start - outcome.token_start % block
    assert outcome.reused_tokens % block == 0 and prefix_blocks <= outcome.reused_tokens < outcome.token_start + block
    assert prefix_blocks > 0
    new = edited(old, 3, REPLACEMENT)
    got = greedy(client, s)
    assert_same_generation(got, fresh_reference(base_url, new), tol.logprob)
    assert got.usage.cached_tokens >= result.num_tokens - result.num_tokens % block - block


def test_auto_measures_its_window_in_vllms_cache_and_amortizes_past_it(client, base_url, tol, block):
    """Mode auto on vLLM: the first request computes the replacement and a 32-token window after it
    exactly; the worker compares the window's rows with the rotated ones amortize would have put there
    (the signal); below the threshold (this server's: never reached) the rest is loaded rotated and the
    window's rows stay exact — through the directive route and a session-bound chat."""
    old, s = own_history(), sid("auto")
    client.create_session(old, session_id=s)
    (outcome,) = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode="auto")]).outcomes
    assert (outcome.requested_mode, outcome.applied_mode) == ("auto", "amortize"), outcome
    decision = outcome.auto
    assert decision.choice == "amortize" and decision.reason == "below_threshold", decision
    assert decision.signal_tokens == 32 and decision.repaired_tokens == 32
    assert decision.layer1_change is not None and decision.layer1_change > 0  # measured: the edit drifts
    assert outcome.rotated_tokens > 0 and outcome.recomputed_tokens >= 32
    # the window right after the replacement equals a fresh prefill on every layer; what follows is rotated
    first = outcome.token_end + outcome.delta
    fresh = sid("fresh")
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    for layer in (0, 1):
        a, b = rows(base_url, s, layer), rows(base_url, fresh, layer)
        window = slice(first, first + 32)
        assert np.abs(a[window] - b[window]).max() <= tol.prefill_row * np.abs(b).max(), layer
    after = slice(first + 32 + block, min(len(a), len(b)))
    layer1 = rows(base_url, s, 1)[after], rows(base_url, fresh, 1)[after]
    assert np.abs(layer1[0] - layer1[1]).max() > 1e-3 * np.abs(layer1[1]).max()  # amortized: approximate there
    c = sid("autochat")
    client.create_session(old, session_id=c)
    asked = edited(old, 3, REPLACEMENT) + [Message(role="user", content="Now the bread, in one line.")]
    (chat_outcome,) = _chat(base_url, c, asked, "auto")["leyline"]["outcomes"]
    assert chat_outcome["applied_mode"] == "amortize" and chat_outcome["auto"]["choice"] == "amortize"
    assert chat_outcome["auto"]["layer1_change"] == pytest.approx(decision.layer1_change, rel=1e-3)


def _amortize(client, s: str, old: list[Message]):
    client.create_session(old, session_id=s)
    result = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode="amortize")])
    return result


def _rotated_positions(outcome) -> range:
    """New positions of the rotated rows: right after the replacement."""
    first = outcome.token_start + (outcome.token_end - outcome.token_start) + outcome.delta
    return range(first, first + outcome.rotated_tokens)


def test_amortize_claims_prefix_and_rotated_blocks_and_layer0_rows_match(client, base_url, tol, block):
    old = own_history()
    s = sid()
    result = _amortize(client, s, old)
    (outcome,) = result.outcomes
    assert outcome.applied_mode == "amortize", outcome.fallback_reason
    prefix_blocks = outcome.token_start - outcome.token_start % block
    assert outcome.reused_tokens >= prefix_blocks > 0
    assert outcome.rotated_tokens >= 4 * block
    assert outcome.delta != 0
    moved = _rotated_positions(outcome)
    # the edited prompt's cached tokens: at least prefix + rotated full blocks
    got = greedy(client, s)
    assert got.usage.cached_tokens >= prefix_blocks + (moved.stop - moved.stop % block - moved.start)

    fresh = sid("fresh")
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    spliced, reference = rows(base_url, s, 0), rows(base_url, fresh, 0)
    a, b = spliced[moved.start:moved.stop], reference[moved.start:moved.stop]
    scale = np.abs(b).max()
    # layer 0 depends only on token and position: the rotated rows are exact up to rounding
    assert np.abs(a - b).max() <= tol.rotary * scale, np.abs(a - b).max() / scale
    # ...and layer 1 still carries the old context (amortize is approximate there)
    assert np.abs(rows(base_url, s, 1)[moved.start:moved.stop] - rows(base_url, fresh, 1)[moved.start:moved.stop]).max() > 0


def test_unrotated_copy_fails_the_layer0_check(client, base_url, tol):
    """Negative control: the same splice with k_pe copied unrotated (test hook) is far off at layer 0."""
    old = own_history()
    s = "norotate-amortize"
    result = _amortize(client, s, old)
    (outcome,) = result.outcomes
    assert outcome.applied_mode == "amortize"
    moved = _rotated_positions(outcome)
    fresh = sid("fresh")
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    a, b = rows(base_url, s, 0)[moved.start:moved.stop], rows(base_url, fresh, 0)[moved.start:moved.stop]
    kv_lora = 512
    assert np.abs(a[:, :kv_lora] - b[:, :kv_lora]).max() <= tol.other * np.abs(b).max()  # c_kv copied fine
    assert np.abs(a[:, kv_lora:] - b[:, kv_lora:]).max() > 0.1 * np.abs(b[:, kv_lora:]).max()  # k_pe is not
    client.delete_session(s)


def _first_rotated(outcome) -> int:
    """The first position whose row amortize moved (approximate): every row before it is exact for the
    edited history's own token ids (the prefix, and the replacement computed in context)."""
    return outcome.token_end + outcome.delta


def test_another_session_gets_no_spliced_rows(client, base_url, tol, prefix_cache):
    """Salt isolation: a second session with the very same edited history may share only the rows that are
    exact for its token ids (vLLM's prefix cache, where it is on), never a rotated one."""
    old = own_history()
    s = sid()
    (outcome,) = _amortize(client, s, old).outcomes
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens > 0, outcome
    other = sid("other")
    info = client.create_session(edited(old, 3, REPLACEMENT), session_id=other)
    assert info.counters.reused_tokens <= _first_rotated(outcome), (info.counters, outcome)
    if prefix_cache:  # the exact rows (unsalted) are shared
        assert info.counters.reused_tokens > 0, info.counters
    assert info.counters.prefilled_tokens == info.num_tokens - info.counters.reused_tokens
    fresh = sid("fresh")
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    # layer 1: the spliced session differs from a fresh prefill, the other session does not
    spliced, mine, reference = (rows(base_url, x, 1) for x in (s, other, fresh))
    assert np.abs(mine - reference).max() <= tol.prefill_row * np.abs(reference).max()
    assert np.abs(spliced - reference).max() > 1e-3 * np.abs(reference).max()


def test_rotated_rows_published_unsalted_are_caught(client, base_url, prefix_cache, block):
    """Negative control of the isolation bound: a session whose approximate rows run unsalted (test hook)
    publishes its rotated blocks to vLLM's prefix cache, and a second session then reuses past the first
    rotated row, whose layer-1 rows are the unsalted session's approximate ones (an honest reference
    cannot be had on this server then: a fresh session would reuse the same published blocks)."""
    if not prefix_cache:
        pytest.skip("vLLM's prefix cache is off in this configuration: nothing is published to share")
    old, s = own_history(), "unsalted-amortize"
    (outcome,) = _amortize(client, s, old).outcomes
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens >= 2 * block, outcome
    info = client.create_session(edited(old, 3, REPLACEMENT), session_id=sid("other"))
    first, reused = _first_rotated(outcome), info.counters.reused_tokens
    assert reused > first, (info.counters, outcome)
    # what it reused past the first rotated row are the unsalted session's approximate rows, as they are
    theirs, approximate = rows(base_url, info.session_id, 1), rows(base_url, s, 1)
    assert np.array_equal(theirs[first:reused], approximate[first:reused])
    client.delete_session(s)


@pytest.mark.parametrize("mode", ["amortize", "forget"])
def test_fault_after_partial_write_falls_back_to_honest_prefill(client, base_url, mode, tol):
    old = own_history()
    s = f"fault-{mode}"  # the server injects a fault into this session's loads after layer 0 is written
    client.create_session(old, session_id=s)
    result = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode=mode)])
    (outcome,) = result.outcomes
    assert outcome.applied_mode == "forget"
    assert outcome.rotated_tokens == 0
    if mode == "forget" and outcome.fallback_reason is None:
        # With prefix caching on (AMX_MLA), vLLM's own cache serves forget's prefix: the connector loads
        # nothing, so there is no fault to fall back from. The rows must still be an honest prefill (below).
        assert outcome.reused_tokens > 0
    else:
        assert outcome.fallback_reason and "kv_load_failed" in outcome.fallback_reason
        assert "injected test fault" in outcome.fallback_reason
    got = greedy(client, s)  # the session's rows are an honest prefill: same answer as fresh
    assert_same_generation(got, fresh_reference(base_url, edited(old, 3, REPLACEMENT)), tol.logprob)
    fresh = sid("fresh")
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    for layer in (0, 1):
        a, b = rows(base_url, s, layer), rows(base_url, fresh, layer)
        n = min(len(a), len(b))
        assert np.abs(a[:n] - b[:n]).max() <= tol.prefill_row * np.abs(b).max()
    client.delete_session(s)


def test_bundled_runtime_and_vllm_agree_on_first_token(client, checkpoint, tol):
    """Same weights, same directive: the bundled runtime vs vLLM, first-token top-5 (JSD reported)."""
    from leyline_runtime.runtime import Runtime, RuntimeConfig
    from leyline_sdk.protocol import DirectiveBatch, GenerateRequest, SessionCreate

    old = own_history()
    directive = Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode="amortize")
    bundled = Runtime(RuntimeConfig(model_path=str(checkpoint)))
    info = bundled.create_session(SessionCreate(session_id="b", messages=old))
    b_result = bundled.apply(DirectiveBatch(session_id="b", directives=[directive]))
    b_gen = bundled.generate("b", GenerateRequest(max_tokens=1, temperature=0, logprobs=True, top_logprobs=5))

    s = sid()
    v_info = client.create_session(old, session_id=s)
    assert v_info.num_tokens == info.num_tokens  # the same token ids on both engines
    v_result = client.apply(s, [directive])
    assert v_result.num_tokens == b_result.num_tokens
    assert v_result.outcomes[0].applied_mode == b_result.outcomes[0].applied_mode == "amortize"
    v_gen = greedy(client, s, max_tokens=1)

    b_top = {t.token: t.logprob for t in b_gen.logprobs[0].top_logprobs}
    v_top = {t.token: t.logprob for t in v_gen.logprobs[0].top_logprobs}
    jsd = top_k_jsd(b_top, v_top)
    print(f"\nbundled vs vLLM first-token top-5 JSD after amortize: {jsd:.2e} "
          f"(bundled {sorted(b_top, key=b_top.get, reverse=True)}, vLLM {sorted(v_top, key=v_top.get, reverse=True)})")
    # the same first choice and top-5, up to ties within the two engines' logprob noise (bf16 on vLLM, fp32
    # bundled: runs on AMX saw 'join' and 'Store' swap first place at JSD 3.0e-4, 'CL' and ' does' the fifth)
    noise = tol.cross_engine_logprob
    b_best, v_best = max(b_top, key=b_top.get), max(v_top, key=v_top.get)
    assert b_top.get(v_best, -math.inf) >= b_top[b_best] - noise, (b_top, v_top)
    assert v_top.get(b_best, -math.inf) >= v_top[v_best] - noise, (b_top, v_top)
    assert_same_top_k_up_to_ties(b_top, v_top, noise)
    assert jsd < 1e-3


def assert_same_top_k_up_to_ties(p_top: dict[str, float], q_top: dict[str, float], tol: float) -> None:
    """The top-k sets agree except at the cut: a token in one side's top-k only may be missing from the
    other's when it ties that side's k-th logprob within tol (random weights give near-equal tails; a CI
    run saw ' IPv' vs ' _' swap 5th place at JSD 3.9e-5)."""
    for mine, other in ((p_top, q_top), (q_top, p_top)):
        cut = min(other.values())
        for token in set(mine) - set(other):
            assert mine[token] <= cut + tol, (token, mine[token], cut)


def top_k_jsd(p_top: dict[str, float], q_top: dict[str, float]) -> float:
    """Jensen-Shannon divergence (nats) of two top-k distributions renormalised over their union."""
    keys = sorted(set(p_top) | set(q_top))
    floor = min(min(p_top.values()), min(q_top.values()))  # a token missing from one side: below its top-k
    p = np.array([math.exp(p_top.get(k, floor)) for k in keys])
    q = np.array([math.exp(q_top.get(k, floor)) for k in keys])
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2
    return float(0.5 * (p * np.log(p / m)).sum() + 0.5 * (q * np.log(q / m)).sum())


def test_vllm_prefix_cache_is_salted_per_session(client, base_url, prefix_cache):
    """Where vLLM keeps its prefix cache (AMX CPUs, GPUs, and this folder's forced bf16 server): a plain
    resend hits it; a plain request on the edited history shares the exact rows before the first rotated
    one, and none of the spliced ones (a second session: the test above; each owns its text, since either
    publishes every row of the edited history, exactly computed)."""
    if not prefix_cache:
        pytest.skip("vLLM's prefix cache is off in this configuration (vLLM's rule for CPU MLA without AMX)")
    old = own_history()
    body = {"model": SERVED_MODEL_NAME, "messages": [m.model_dump(exclude_none=True) for m in old],
            "max_tokens": 1, "temperature": 0}
    httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).raise_for_status()
    again = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    s = sid()
    (outcome,) = _amortize(client, s, old).outcomes
    first_rotated = _first_rotated(outcome)
    plain = {**body, "messages": [m.model_dump(exclude_none=True) for m in edited(old, 3, REPLACEMENT)]}
    reply = httpx.post(f"{base_url}/v1/chat/completions", json=plain, timeout=600).json()
    assert 0 < reply["usage"]["prompt_tokens_details"]["cached_tokens"] <= first_rotated, reply["usage"]


def _chat(base_url: str, session_id: str, messages: list[Message], mode: str) -> dict:
    """A session-bound chat whose history differs from the session's: its edits and the generation
    run in one pass through vLLM (two with an amortized replacement)."""
    body = {"model": SERVED_MODEL_NAME, "messages": [m.model_dump(exclude_none=True) for m in messages],
            "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 5, "session_id": session_id,
            "leyline": {"mode": mode}}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_with_a_forget_edit_equals_a_fresh_prefill(client, base_url, tol, block):
    old, s = own_history(), sid("chatf")
    info = client.create_session(old, session_id=s)
    asked = edited(old, 3, REPLACEMENT) + [Message(role="user", content="Now the bread, in one line.")]
    reply = _chat(base_url, s, asked, "forget")
    report = reply["leyline"]
    (outcome,) = report["outcomes"]
    assert outcome["applied_mode"] == "forget" and outcome["rotated_tokens"] == 0
    assert report["version"] == info.version + 2  # the edit's version, then the reply's
    reference = fresh_reference(base_url, asked)
    got = reply["choices"][0]["logprobs"]["content"]
    assert_same_greedy([(t["token"], t["logprob"]) for t in got], reference, tol.logprob)
    # the prefix before the edit was loaded, everything after it computed once
    assert 0 < outcome["reused_tokens"] <= outcome["token_start"] + block
    total = reply["usage"]["prompt_tokens"]
    assert report["prefilled_tokens"] == total - reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert total - outcome["token_start"] - block <= report["prefilled_tokens"] <= total - outcome["reused_tokens"]
    after = client.get_session(s, include_messages=True)
    assert after.version == report["version"] and [m.content for m in after.messages[:-1]] == [m.content for m in asked]


def test_chat_with_an_amortize_edit_rotates_and_matches_layer0(client, base_url, tol, block):
    old, s = own_history(), sid("chata")
    client.create_session(old, session_id=s)
    asked = edited(old, 3, REPLACEMENT) + [Message(role="user", content="Now the bread, in one line.")]
    report = _chat(base_url, s, asked, "amortize")["leyline"]
    (outcome,) = report["outcomes"]
    assert outcome["applied_mode"] == "amortize", outcome["fallback_reason"]
    assert outcome["rotated_tokens"] >= 4 * block and outcome["delta"] != 0
    # computed: the replacement, the new message and the partial blocks around them, not the moved rows
    assert report["prefilled_tokens"] < outcome["rotated_tokens"]
    first = outcome["token_start"] + (outcome["token_end"] - outcome["token_start"]) + outcome["delta"]
    moved = range(first, first + outcome["rotated_tokens"])
    fresh = sid("fresh")
    client.create_session(asked, session_id=fresh)
    a, b = rows(base_url, s, 0)[moved.start:moved.stop], rows(base_url, fresh, 0)[moved.start:moved.stop]
    assert np.abs(a - b).max() <= tol.rotary * np.abs(b).max()
