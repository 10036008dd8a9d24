"""mode "auto": its choices, the partial-recompute primitive, the drift budget, and their surfaces."""

import math

import pytest
import torch
from starlette.testclient import TestClient
from server_support import make_runtime, metric, torch_threads

from leyline_runtime import cli, create_app
from leyline_runtime.auto_rule import AutoConfig
from leyline_runtime.directives.auto_mode import layer0_attention
from leyline_sdk import auto_policy, force_mode
from leyline_sdk.policy import EditContext
from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate, Span

from helpers import agent_history, fp32_diff

T = "__auto__"
INF = math.inf


@pytest.fixture(scope="module")
def rt():
    with torch_threads(1):
        yield make_runtime()


@pytest.fixture
def auto(rt, monkeypatch):
    """Set the runtime's auto config for one test."""
    def set_config(**kw):
        kw = {"short_tail": 32, "repair_tail": 32, "signal_window": 16, "drift_budget": None, **kw}
        monkeypatch.setattr(rt.auto, "config", AutoConfig(**kw))
    return set_config


def session(rt, messages):
    return rt._sessions[(T, rt.create_session(SessionCreate(messages=messages), T).session_id)]


def rows(rt, s):
    return rt.pool.rows[:, s.table.rows(0, s.num_tokens)].clone()


def apply(rt, s, *directives):
    return rt.apply(DirectiveBatch(session_id=s.session_id, directives=list(directives)), T)


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def equals_fresh_prefill(rt, s) -> bool:
    fresh = session(rt, s.messages)
    assert fresh.tokens == s.tokens
    return fp32_diff(rows(rt, s), rows(rt, fresh)) <= 2e-6


def drop_failed_attempt(mode):
    return Directive(span=Span(start=2, end=4), mode=mode)  # the failed call and its error


def test_auto_on_a_short_tail_chooses_forget(rt, auto):
    auto(forget_threshold=INF, repair_threshold=INF)  # the signal alone would amortize
    h = agent_history()
    s = session(rt, h)
    cleared = h[9].model_copy(update={"content": "[cleared]"})  # the last message
    o = apply(rt, s, Directive(span=Span(start=9, end=10), replacement=[cleared], mode="auto")).outcomes[0]
    assert (o.requested_mode, o.applied_mode, o.auto.choice, o.auto.reason) == ("auto", "forget", "forget", "short_tail")
    assert o.rotated_tokens == 0 and o.recomputed_tokens == s.num_tokens - o.token_start
    assert equals_fresh_prefill(rt, s)


def count_prefilled(rt, monkeypatch) -> list[int]:
    """Record every position the engine prefills (splice prefills and recomputes alike: both
    go through ``prefill_runs``)."""
    seen: list[int] = []
    prefill_runs = rt.engine.prefill_runs

    def counted_runs(table, runs, *a, **kw):
        for start, tokens in runs:
            seen.extend(range(start, start + len(tokens)))
        return prefill_runs(table, runs, *a, **kw)

    monkeypatch.setattr(rt.engine, "prefill_runs", counted_runs)
    return seen


def test_auto_signal_over_threshold_forgets(rt, auto, monkeypatch):
    auto(forget_threshold=0.0)
    s = session(rt, agent_history())
    replaced = s.messages[7].model_copy(update={"content": "[cleared]"})
    seen = count_prefilled(rt, monkeypatch)
    o = apply(rt, s, Directive(span=Span(start=7, end=8), replacement=[replaced], mode="auto")).outcomes[0]
    assert o.auto.choice == "forget" and o.auto.reason == "signal" and o.auto.layer1_change > 0
    assert o.auto.signal_tokens == 16 and o.applied_mode == "forget" and 0 < o.auto.attention < 1
    # every row from the edit on is computed exactly once: the replacement's splice-time
    # prefill is kept, the forget recomputes only what follows it
    assert sorted(seen) == list(range(o.token_start, s.num_tokens))
    assert o.recomputed_tokens == s.num_tokens - o.token_start
    assert equals_fresh_prefill(rt, s)


def test_layer0_attention_matches_expanded_attention(rt):
    """The absorbed, cache-reading attention share equals per-head attention computed from the
    tokens through the expanded keys (kv_b_proj applied to the latent)."""
    s = session(rt, agent_history())
    n, q = s.num_tokens, 8
    attn = rt.model.model.layers[0].self_attn
    cfg = attn.cfg
    with torch.no_grad():
        x = rt.model.model.layers[0].input_layernorm(rt.model.model.embed_tokens(torch.tensor(s.tokens)))
        cos, sin = rt.model.rotary.cos_sin(torch.arange(n), x.dtype)
        q_nope, q_pe = attn._queries(x[n - q:], cos[n - q:], sin[n - q:])
        c_kv, k_pe = attn.latent(x, cos, sin).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        k_nope = attn.kv_b_proj(c_kv).view(n, attn.num_heads, -1)[..., : cfg.qk_nope_head_dim]
        scores = (torch.einsum("qhd,khd->qhk", q_nope, k_nope) + torch.einsum("qhd,kd->qhk", q_pe, k_pe)) * attn.scale
        mask = torch.arange(n)[None, :] > torch.arange(n - q, n)[:, None]
        probs = scores.masked_fill(mask[:, None], float("-inf")).softmax(-1)
    for a, b in ((0, n), (20, 60), (n - 5, n)):
        got = layer0_attention(rt.engine, s.table, s.tokens, a, b, q)
        assert got == pytest.approx(float(probs[..., a:b].sum(-1).mean()), abs=1e-5)
    assert layer0_attention(rt.engine, s.table, s.tokens, 0, n, q) == pytest.approx(1.0, abs=1e-5)


def test_auto_repair_recomputes_only_the_tail(rt, auto):
    auto(forget_threshold=INF, repair_threshold=0.0)
    plain, s = session(rt, agent_history()), session(rt, agent_history())
    apply(rt, plain, drop_failed_attempt("amortize"))
    o = apply(rt, s, drop_failed_attempt("auto")).outcomes[0]
    assert (o.applied_mode, o.auto.choice, o.auto.reason) == ("amortize", "repair", "signal")
    assert o.auto.repaired_tokens == 32 and o.recomputed_tokens == 32 and o.rotated_tokens > 0
    n = s.num_tokens
    a, b = rows(rt, plain), rows(rt, s)
    assert torch.equal(a[:, : n - 32], b[:, : n - 32])  # the splice itself is amortize's
    assert max_diff(a[:, n - 32:], b[:, n - 32:]) > 1e-4  # the tail was recomputed
    assert s.counters.recomputed_tokens == 32


@pytest.mark.parametrize("repair_threshold", [INF, None])  # None, the default: never a tail repair
def test_auto_below_threshold_amortizes_and_counts_drift(rt, auto, repair_threshold):
    assert AutoConfig().repair_threshold is None
    auto(forget_threshold=INF, repair_threshold=repair_threshold)
    plain, s = session(rt, agent_history()), session(rt, agent_history())
    apply(rt, plain, drop_failed_attempt("amortize"))
    o = apply(rt, s, drop_failed_attempt("auto")).outcomes[0]
    assert o.auto.choice == "amortize" and o.auto.reason == "below_threshold"
    assert o.recomputed_tokens == 0 and torch.equal(rows(rt, plain), rows(rt, s))
    info = rt.get_session(s.session_id, T)
    layers = rt.model.config.num_hidden_layers  # the stale layer-1 rows feed the layers above
    assert info.drift.drift == pytest.approx(o.auto.layer1_change * (layers - 1)) == pytest.approx(o.auto.session_drift)
    assert info.drift.earliest_position == o.token_start and info.drift.repairs == 0


def test_partial_recompute_equals_fresh_prefill_rows(rt):
    s = session(rt, agent_history())
    a = apply(rt, s, drop_failed_attempt("amortize")).outcomes[0].token_start  # rows before a are exact
    b = a + 37  # neither end on a block boundary
    fresh = rows(rt, session(rt, s.messages))
    before, free = rows(rt, s), rt.pool.num_free
    assert max_diff(before[:, a:b], fresh[:, a:b]) > 1e-3  # amortize left them stale
    rt.executor.recompute(s, a, b)
    after = rows(rt, s)
    assert fp32_diff(after[:, a:b], fresh[:, a:b]) <= 2e-6  # same sums in another order: relative bound
    assert torch.equal(after[:, :a], before[:, :a]) and torch.equal(after[:, b:], before[:, b:])
    assert rt.pool.num_free == free  # the copied blocks replaced the old ones


def test_partial_recompute_failure_leaves_the_session_intact(rt, monkeypatch):
    s = session(rt, agent_history())
    table, before, free = list(s.table.blocks), rows(rt, s), rt.pool.num_free

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(rt.engine, "prefill", broken)
    with pytest.raises(RuntimeError):
        rt.executor.recompute(s, 5, 40)
    assert s.table.blocks == table and torch.equal(rows(rt, s), before) and rt.pool.num_free == free
    with pytest.raises(ValueError):
        rt.executor.recompute(s, 10, s.num_tokens + 1)


def test_drift_budget_triggers_a_repair_and_the_session_equals_R(rt, auto):
    auto(forget_threshold=INF, repair_threshold=INF)  # auto amortizes; only the budget repairs
    h = agent_history()
    s = session(rt, h)
    first = apply(rt, s, drop_failed_attempt("auto")).outcomes[0]
    assert first.auto.drift_repair_tokens == 0 and not equals_fresh_prefill(rt, s)
    auto(forget_threshold=INF, repair_threshold=INF, drift_budget=first.auto.session_drift)
    edited = s.messages[5].model_copy(update={"content": "\n".join(s.messages[5].content.split("\n")[:8])})
    o = apply(rt, s, Directive(span=Span(start=5, end=6), replacement=[edited], mode="auto")).outcomes[0]
    assert o.auto.choice == "amortize" and o.auto.session_drift == 0.0
    assert o.auto.drift_repair_tokens == s.num_tokens - first.token_start  # from the first edit on
    assert equals_fresh_prefill(rt, s)
    info = rt.get_session(s.session_id, T).drift
    assert (info.drift, info.earliest_position, info.repairs) == (0.0, None, 1)
    assert info.budget == first.auto.session_drift


def test_auto_policy_and_forced_auto():
    edit = EditContext([Message(role="tool", content="x", tool_call_id="c")],
                       [Message(role="tool", content="[cleared]", tool_call_id="c")], 3, 6)
    assert auto_policy(edit) == "auto" and force_mode("auto")(edit) == "auto"
    retraction = EditContext([Message(role="user", content="q")], [], 1, 6)
    assert auto_policy(retraction) == "forget"


def test_serve_flag_for_the_drift_budget():
    parse = cli.build_parser().parse_args
    assert parse(["serve"]).drift_budget == AutoConfig().drift_budget
    assert parse(["serve", "--drift-budget", "none"]).drift_budget is None
    assert parse(["serve", "--drift-budget", "0.25"]).drift_budget == 0.25
    for bad in ("-1", "nan", "lots"):
        with pytest.raises(SystemExit):
            parse(["serve", "--drift-budget", bad])


def test_rest_auto_directive_session_drift_and_metrics():
    with torch_threads(1):
        runtime = make_runtime(auto=AutoConfig(short_tail=32, repair_tail=32, signal_window=16, forget_threshold=INF,
                                               repair_threshold=INF, drift_budget=0.0))
    with TestClient(create_app(runtime=runtime)) as client:
        history = [m.model_dump(exclude_none=True) for m in agent_history()]
        sid = client.post("/sessions", json={"messages": history}).json()["session_id"]
        r = client.post("/directives", json={"session_id": sid, "directives": [
            {"span": {"start": 2, "end": 4}, "mode": "auto"}]})
        assert r.status_code == 200, r.text
        o = r.json()["outcomes"][0]
        assert o["requested_mode"] == "auto" and o["auto"]["choice"] == "amortize"
        assert o["auto"]["drift_repair_tokens"] > 0  # budget 0: any drift is repaired at once
        drift = client.get(f"/sessions/{sid}").json()["drift"]
        assert drift == {"drift": 0.0, "budget": 0.0, "earliest_position": None, "repairs": 1,
                         "repaired_tokens": o["auto"]["drift_repair_tokens"]}
        text = client.get("/metrics").text
        assert metric(text, "leyline_drift_repairs_total") == 1
        assert metric(text, "leyline_drift_repaired_tokens_total") == o["auto"]["drift_repair_tokens"]
        assert metric(text, "leyline_auto_choices_total", choice="amortize", reason="below_threshold") == 1
        assert metric(text, "leyline_drift_budget") == 0.0
        bad = client.post("/directives", json={"session_id": sid, "directives": [
            {"span": {"start": 2, "end": 4}, "mode": "sometimes"}]})
        assert bad.status_code == 422
