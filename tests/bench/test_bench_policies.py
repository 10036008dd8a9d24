"""The policy comparison's parts: agent-like edit sessions, stress models, suffix scoring, arms."""

import pytest
import torch

from leyline_bench.fidelity import stress_models
from leyline_bench.fidelity.edit_sessions import KINDS, PROTECTED_TAIL, build_session
from leyline_bench.fidelity.policies import check_policies, jsd_rows, run_session
from leyline_bench.fidelity.policy_bench import equal_cost, multi_edit_sessions
from leyline_bench.fidelity.edit_sessions import EditSession, Step
from leyline_runtime.inspection import Inspector
from leyline_runtime.model import load_model
from leyline_runtime.model.default import DEFAULT_MODEL_DIR, default_tokenizer_path
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.text.tokenizer import ChatTokenizer
from leyline_sdk.diff import apply_directives
from leyline_sdk.protocol import Directive, SessionCreate, Span

from helpers import agent_history
from server_support import torch_threads


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer.from_file(default_tokenizer_path())


@pytest.fixture(scope="module")
def rt(tok):
    return Runtime(RuntimeConfig(max_cache_tokens=16384))


def test_edit_sessions_are_agent_like_and_valid(tok):
    kinds = set()
    for seed in range(2):
        s = build_session(tok, seed, edits=20)
        assert s == build_session(tok, seed, edits=20)  # deterministic
        assert len(s.steps) == 20
        messages = list(s.history)
        for step in s.steps:
            kinds.add(step.kind)
            for d in step.directives:
                assert d.span.end <= len(messages) - PROTECTED_TAIL and d.span.start >= 1
            messages = apply_directives(messages, step.directives) + step.next_turn
            assert sum(map(len, tok.encode_messages(messages))) < 3500
    assert set(KINDS) <= kinds


def test_session_seed_picks_the_multi_edit_sessions(tok):
    """Calibrate on one seed range, report on another: --session-seed S --sessions n builds seeds S..S+n-1."""
    import argparse

    from leyline_bench.fidelity import fidelity

    parser = argparse.ArgumentParser()
    fidelity.add_parser(parser.add_subparsers())
    args = parser.parse_args(["fidelity", "--policies", "auto", "--sessions", "2", "--session-seed", "3",
                              "--edits", "2", "--session-tokens", "500"])
    sessions = multi_edit_sessions(tok, args)
    assert [s.name for s in sessions] == ["session_3", "session_4"]
    assert sessions[1] == build_session(tok, 4, edits=2, start_tokens=500)
    assert sessions[0] != build_session(tok, 0, edits=2, start_tokens=500)


def test_stacked_model_repeats_the_trained_layers(tok):
    base = load_model(str(DEFAULT_MODEL_DIR))
    ids = torch.tensor([tok.encode("the value of api_port is 8080")])
    with torch.no_grad():
        assert torch.equal(stress_models.stacked(base, 6)(ids), base(ids))
    deep = stress_models.stacked(base, 12)
    assert deep.config.num_hidden_layers == 12
    assert torch.equal(deep.model.layers[7].mlp.up_proj.weight, base.model.layers[1].mlp.up_proj.weight)


def test_suffix_logits_equal_a_plain_forward_on_an_honest_prefill(rt):
    sid = rt.create_session(SessionCreate(messages=agent_history()), "__policies__").session_id
    inspect = Inspector(rt)
    try:
        toks = inspect.tokens(sid, "__policies__")
        free = inspect.free_blocks
        got = inspect.suffix_logits(sid, 40, "__policies__")
        assert inspect.free_blocks == free  # the scratch blocks went back
    finally:
        rt.delete_session(sid, "__policies__")
    with torch.no_grad():
        want = rt.model(torch.tensor([toks]))[0, 40:]
    assert (got - want).abs().max().item() <= 1e-3
    assert jsd_rows(want, got).max().item() <= 1e-8


@pytest.mark.slow  # every policy arm on a session (~11 s on 2 cores): make test-slow
def test_policy_arms_on_a_two_edit_session(rt):
    h = agent_history(long_output_lines=40)
    clear = Directive(span=Span(start=5, end=6), replacement=[h[5].model_copy(update={"content": "[cleared]"})])
    drop = Directive(span=Span(start=2, end=4))
    turn = [h[8].model_copy(), h[9].model_copy()]
    session = EditSession("tiny", h[:8], [Step("clear", [clear], turn), Step("drop", [drop], [])])
    policies = check_policies(["amortize", "forget-every-2"])
    assert policies == ["amortize", "forget-every-2", "forget"]
    rec = run_session(rt, session, policies)
    assert rec["forget_vs_fresh"]["max_jsd"] <= 1e-9
    arms = rec["arms"]
    assert 0 < arms["amortize"]["recomputed"] < arms["forget"]["recomputed"]
    # step 1: forget-every-2 amortizes like amortize; step 2: forget + repair -> exact again
    assert arms["forget-every-2"]["probe_jsd"][0] == pytest.approx(arms["amortize"]["probe_jsd"][0], abs=1e-12)
    assert arms["forget-every-2"]["probe_jsd"][1] <= 1e-9 < arms["amortize"]["probe_jsd"][1]
    assert max(arms["forget"]["suffix_jsd"]) <= 1e-12 and max(arms["amortize"]["suffix_jsd"]) > 1e-6
    # decisive positions: R's own top-2 gap, one flag per next-turn position
    assert len(rec["next_decisive"]) == len(arms["forget"]["next_top1"]) > 0
    assert 0 < sum(rec["next_decisive"]) < len(rec["next_decisive"])
    with pytest.raises(ValueError):
        check_policies(["sometimes"])


def test_equal_cost_interpolates_the_forget_every_n_family():
    def point(share, jsd, top1):
        return {"share": share, "next_jsd_p90": jsd, "next_top1": top1}

    summary = {"amortize": point(0.02, 1e-4, 0.98), "forget-every-5": point(0.2, 1e-5, 0.99),
               "forget": point(1.0, 0.0, 1.0), "auto": point(0.05, 1e-6, 1.0), "forget_vs_fresh_max_jsd": 0.0}
    mid = equal_cost(summary, 0.02 * 10 ** 0.5)  # halfway between amortize and forget-every-5 in log cost
    assert mid["family_jsd_p90"] == pytest.approx(10 ** -4.5)
    assert mid["family_top1"] == pytest.approx(0.985)
    assert mid["family_between"] == "amortize – forget-every-5"
    assert equal_cost(summary, 0.2)["family_jsd_p90"] == pytest.approx(1e-5)
    assert equal_cost(summary, 0.01)["family_jsd_p90"] is None  # cheaper than the whole family


def test_random_stress_models_at_any_depth():
    v2 = stress_models.build("v2-random-3", 512)
    v3 = stress_models.build("v3-random-5", 512)
    assert (v2.config.model_type, v2.config.num_hidden_layers, v2.config.q_lora_rank) == ("deepseek_v2", 3, 96)
    assert (v3.config.model_type, v3.config.num_hidden_layers) == ("deepseek_v3", 5)
    assert v3.config.is_moe_layer(4) and not v3.config.is_moe_layer(0)
    for bad in ("v4-random", "v2-random-", "v2-random-x", "stack"):
        with pytest.raises(ValueError):
            stress_models.build(bad, 512)
