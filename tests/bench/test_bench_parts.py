"""The bench's building blocks: exact-size edits, shipped workload and traces, forks,
admission rules, replay accounting, the transformers peer's crop path."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from helpers import agent_history
from server_support import torch_threads

from leyline_bench.fidelity import admission
from leyline_bench.common.exact import grow
from leyline_bench.common.histories import history_of_length, make_edit, offsets
from leyline_bench.agent.replay_arms import (
    Leyline,
    NoCache,
    PrefixCache,
    history_tokens,
)
from leyline_bench.common.prefix import common_prefix_length as common_prefix
from leyline_bench.agent.synthetic_traces import PATTERNS, make_trace
from leyline_runtime.inspection import Inspector
from leyline_runtime.model.default import default_tokenizer_path
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.text.tokenizer import ChatTokenizer
from leyline_sdk.diff import apply_directives, split_append
from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate, Span

ROOT = Path(__file__).resolve().parents[2]
MAX_POSITIONS = 4096


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer.from_file(default_tokenizer_path())


@pytest.fixture(scope="module")
def runtime():
    return Runtime(RuntimeConfig(max_cache_tokens=16384))


def n_tokens(tok, messages):
    return sum(map(len, tok.encode_messages(messages)))


@pytest.mark.parametrize("delta", [1, 2, 127, 128, 129, 1024])
def test_grow_adds_exactly_delta_tokens(tok, delta):
    msg = agent_history()[7]
    assert len(tok.encode_message(grow(tok, msg, delta))) - len(tok.encode_message(msg)) == delta


@pytest.mark.parametrize("n", [420, 1000, 2048])
def test_history_of_length_is_exact(tok, n):
    h = history_of_length(tok, n)
    assert n_tokens(tok, h) == n
    assert h[0].role == "system"


@pytest.mark.parametrize("span", ["message", "10pct"])
@pytest.mark.parametrize("position", [0.1, 0.5, 0.9])
def test_edit_specs_start_near_their_position(tok, position, span):
    h = history_of_length(tok, 2048)
    spec = make_edit(tok, h, position, span)
    edited = apply_directives(h, [spec.directive])
    assert n_tokens(tok, edited) < 2048
    assert spec.start_token == offsets(tok, h)[spec.directive.span.start]
    if span == "10pct":
        assert spec.span_tokens >= 2048 // 10


def test_admission_rules(tok):
    end = tok.end_id
    answer = tok.encode("The port is 8080.")
    assert admission.hits(tok, answer + [end], "8080", 32)
    assert not admission.hits(tok, tok.encode("no idea") + [end] + tok.encode("8080"), "8080", 32)
    long_target = "test_compute_moth_edge_case_value"
    cut = tok.encode(long_target)[:4]
    assert admission.hits(tok, cut, long_target, 4)  # ran out of budget while spelling it
    assert not admission.hits(tok, cut[:3] + [end], long_target, 4)
    v = admission.judge(tok, answer, answer, tok.encode("no"), "8080", 32)
    assert v.admitted and not v.l_hits
    v = admission.judge(tok, answer, tok.encode("no"), answer, "8080", 32)
    assert not v.admitted and "R misses" in v.reason
    implicit = admission.judge(tok, answer, answer, answer[:3], None, 32)
    assert implicit.implicit_target and implicit.admitted and not implicit.l_hits


def _cases():
    path = ROOT / "benchmarks" / "fidelity_workload.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_shipped_workload_covers_the_categories(tok):
    cases = _cases()
    assert len(cases) >= 50
    cats = {c["category"] for c in cases}
    assert {"drop_failed_attempt", "clear_old_tool_output", "truncate_long_output", "replace_message",
            "multi_edit_drift", "position_stress"} <= cats
    ks = {len(c["edits"]) for c in cases if c["category"] == "multi_edit_drift"}
    assert ks == {1, 2, 4, 8}
    for c in cases:
        history = [Message.model_validate(m) for m in c["history"]]
        assert n_tokens(tok, history) + 1024 + 64 <= MAX_POSITIONS
        assert ("directives" in c) != ("edits" in c)
        assert c["target"]


def test_shipped_position_stress_deltas_are_exact(tok):
    stress = [c for c in _cases() if c["category"] == "position_stress"]
    assert {c["expected_delta"] for c in stress} == {1, 127, 128, 129, 1024}
    for c in stress:
        history = [Message.model_validate(m) for m in c["history"]]
        edited = apply_directives(history, [Directive.model_validate(d) for d in c["directives"]])
        assert n_tokens(tok, edited) - n_tokens(tok, history) == c["expected_delta"]


def test_shipped_traces_have_edits_every_pattern(tok):
    lines = (ROOT / "benchmarks" / "traces.jsonl").read_text().splitlines()
    traces = [json.loads(line) for line in lines if line.strip()]
    assert {t["pattern"] for t in traces} == set(PATTERNS)
    for t in traces:
        assert 8 <= len(t["turns"]) <= 15
        turns = [[Message.model_validate(m) for m in turn] for turn in t["turns"]]
        edits = 0
        for old, new in itertools.pairwise(turns):
            directives, _ = split_append(old, new)
            edits += bool(directives)
            assert n_tokens(tok, new) < MAX_POSITIONS
        assert edits >= 1, t["name"]


def test_traces_are_deterministic(tok):
    assert make_trace(tok, "summarise", 0) == make_trace(tok, "summarise", 0)


def test_fork_is_an_exact_independent_copy(runtime):
    inspect = Inspector(runtime)
    free = inspect.free_blocks
    sid = runtime.create_session(SessionCreate(messages=agent_history()), "t").session_id
    fork = inspect.fork(sid, "t")
    before = inspect.cache_rows(sid, "t")
    assert torch.equal(inspect.cache_rows(fork, "t"), before)
    assert inspect.tokens(fork, "t") == inspect.tokens(sid, "t")
    assert runtime.get_session(fork, "t").version == runtime.get_session(sid, "t").version
    assert not set(inspect.block_ids(sid, "t")) & set(inspect.block_ids(fork, "t"))  # rows of its own
    runtime.apply(DirectiveBatch(session_id=fork, directives=[Directive(span=Span(start=2, end=4))]), "t")
    assert torch.equal(inspect.cache_rows(sid, "t"), before)
    assert runtime.get_session(sid, "t").num_messages == len(agent_history())
    runtime.delete_session(fork, "t")
    runtime.delete_session(sid, "t")
    assert inspect.free_blocks == free


def test_amortize_on_a_fragmented_pool_writes_the_same_rows(tok):
    """Neighbouring blocks (the tail copied as slices) and shuffled blocks (every row moved by
    index, as ``--fragment-pool`` measures) leave the same cache, bit for bit."""
    history = history_of_length(tok, 1024)
    directive = make_edit(tok, history, 0.1, "10pct-delete").directive
    caches, neighbours = [], []
    for fragment in (False, True):
        rt = Runtime(RuntimeConfig(max_cache_tokens=4096))
        inspect = Inspector(rt)
        if fragment:
            inspect.shuffle_free_blocks()
        sid = rt.create_session(SessionCreate(messages=history), "t").session_id
        outcome = rt.apply(DirectiveBatch(session_id=sid, directives=[directive]), "t").outcomes[0]
        assert outcome.applied_mode == "amortize" and outcome.rotated_tokens > 256
        caches.append(inspect.cache_rows(sid, "t"))
        blocks = inspect.block_ids(sid, "t")
        neighbours.append(sum(b == a + 1 for a, b in zip(blocks, blocks[1:])) / (len(blocks) - 1))
    assert neighbours[0] > 0.9 and neighbours[1] < 0.1
    assert torch.equal(caches[0], caches[1])


def test_replay_accounting(runtime):
    h = agent_history(long_output_lines=8)
    for i, m in enumerate(h):
        m.id = f"m{i}"
    cleared = [m.model_copy(update={"content": "[cleared]"}) if i == 7 else m for i, m in enumerate(h)]
    turns = [h[:2], h[:8], cleared[:10]]
    arms = {"none": NoCache(runtime), "prefix": PrefixCache(runtime), "amortize": Leyline(runtime, "amortize")}
    try:
        stats = {name: [arm.turn(t) for t in turns] for name, arm in arms.items()}
    finally:
        for arm in arms.values():
            arm.close()
    for k, t in enumerate(turns):
        prompt = len(history_tokens(runtime, t))
        for name in arms:
            s = stats[name][k]
            assert s.prompt_tokens == prompt and s.reused_tokens + s.prefilled_tokens == prompt
        assert stats["none"][k].reused_tokens == 0
    # prefix cache reuses exactly the common token prefix with the previous turn
    for k in (1, 2):
        assert stats["prefix"][k].reused_tokens == common_prefix(history_tokens(runtime, turns[k - 1]),
                                                                 history_tokens(runtime, turns[k]))
    # amortize keeps the rows after the cleared output: only the placeholder and the tail are prefilled
    last = stats["amortize"][2]
    tail = len(history_tokens(runtime, turns[2][8:]))
    assert last.prefilled_tokens <= tail + 8 and last.rotated_tokens > 0
    assert last.reused_tokens > stats["prefix"][2].reused_tokens
    assert runtime.list_sessions("__bench_replay__") == []


def test_peer_crop_equals_full_prefill(runtime, tmp_path):
    pytest.importorskip("transformers")
    from leyline_bench.micro.peer import TransformersPeer, checkpoint_folder

    peer = TransformersPeer(checkpoint_folder(None, runtime.model, str(tmp_path)))
    ids = torch.randint(10, 1000, (96,), generator=torch.Generator().manual_seed(0)).tolist()
    edited = ids[:40] + ids[50:]
    full = peer.prefill(edited)
    cropped = peer.crop_and_prefill(peer.prefill(ids), edited, 40)
    assert cropped.get_seq_length() == full.get_seq_length() == len(edited)
    for a, b in zip(full.layers, cropped.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


def _module_macs(layer, cfg) -> int:
    """A token's multiply-adds through one decoder layer's products, read off its modules."""
    def linears(module):
        return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear))

    attn = linears(layer.self_attn)
    mlp = layer.mlp
    if not hasattr(mlp, "experts"):
        return attn + linears(mlp)
    shared = linears(mlp.shared_experts) if mlp.shared_experts is not None else 0
    return attn + mlp.gate.weight.numel() + cfg.num_experts_per_tok * linears(mlp.experts[0]) + shared


@pytest.mark.parametrize("variant", ["default", "v2-random", "v3-random"])
def test_prefill_flops_count_every_product_of_the_model(variant):
    from leyline_bench.micro.roofline import prefill_flops, token_macs
    from leyline_bench.fidelity.stress_models import build

    model = build(variant, vocab_size=8192)
    cfg = model.config
    per_layer = [_module_macs(layer, cfg) for layer in model.model.layers]
    assert [token_macs(cfg, i) for i in range(cfg.num_hidden_layers)] == per_layer
    n = 100
    flops = prefill_flops(cfg, n)
    assert flops["products"] == 2 * n * sum(per_layer)
    per_pair = 2 * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * cfg.num_hidden_layers
    assert flops["attention"] == per_pair * sum(range(1, n + 1))  # query i sees keys 0..i
    assert flops["head"] == 2 * cfg.hidden_size * cfg.vocab_size
    assert flops["total"] == flops["products"] + flops["attention"] + flops["head"]
