"""The plugin on the model families agents run: one real ``vllm serve`` per family (tiny random checkpoints
written with transformers at test time), each checked against vLLM itself.

For every family: the connector's verdict (``/healthz`` ``splice``: spliced with this pairing and rotary
width, or refused with a named reason — never a failed start); ``forget`` equals vLLM's own endpoint on the
edited history (greedy tokens, logprobs). For spliced families: ``amortize``'s layer-0 rows of the moved
tokens equal a fresh prefill's — the rotary dims of every K head within rounding, V and the non-rotary K
dims as vLLM computed them — while the same splice copied without rotation, or rotated with the other
pairing, fails that check. For refused families: an ``amortize`` that had to rotate is applied as
``forget`` with ``fallback_reason: "unsupported_runtime: ..."``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from leyline_bench.vllm.checks import (
    REPLACEMENT,
    amortize_once,
    chat_ids,
    edited,
    fresh_completion,
    greedy,
    history,
    layer0_errors,
    moved_layer0,
    rows,
    splice_info,
    split_rope,
)
from leyline_testkit.tiny_models import make_tiny_checkpoint
from leyline_testkit.vllm_server import VllmServer
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Span
from leyline_testkit.vllm_server import SERVED_MODEL_NAME
from test_vllm_directives import assert_same_generation
from tolerances import TOLERANCE

NO_ROTATE, WRONG_PAIRING = "norotate-fam", "wrongpair-fam"


@dataclass(frozen=True)
class Expected:
    rope: str | None = None  # the vLLM rotary class read, for spliced families
    pair_layout: str | None = None
    partial: bool = False  # rotary_dim < head_size
    refused: str | None = None  # a phrase of the refusal, for refused families
    # Greedy tokens compared with vLLM's own fresh prefill. gpt-oss: 1, because vLLM 0.32 (CPU) itself
    # changes the tokens after the first when a request hits its prefix cache on this hybrid
    # sliding-window model (plain /v1/completions, no plugin: a resend of the same ids decodes
    # differently from its first send), and the session's requests do hit it.
    compared_tokens: int = 6


# Every family of leyline_testkit.tiny_models.FAMILIES but deepseek_v2 (MLA: test_vllm_directives.py).
EXPECTED = {
    "llama3": Expected("Llama3RotaryEmbedding", "half_split"),
    "llama_linear": Expected("LinearScalingRotaryEmbedding", "half_split"),
    "qwen2": Expected("RotaryEmbedding", "half_split"),  # qkv bias
    "qwen3": Expected("RotaryEmbedding", "half_split"),  # q/k norm
    "qwen3_yarn": Expected("YaRNScalingRotaryEmbedding", "half_split"),
    "mistral": Expected("RotaryEmbedding", "half_split"),
    "glm4": Expected("RotaryEmbedding", "interleaved", partial=True),
    "gptj": Expected("RotaryEmbedding", "interleaved"),  # MHA
    "cohere": Expected("RotaryEmbedding", "interleaved"),
    "gpt_oss": Expected(refused="sliding-window", compared_tokens=1),  # alternating sliding-window layers, attention sinks
    # Gated DeltaNet + gated attention: a recurrent state, no per-token row (starts only with vLLM's hybrid
    # memory allocator, which the connector declares)
    "qwen3_next": Expected(refused="hybrid attention/recurrent model (QwenGatedDeltaNetAttention layers)"),
    # llama3 with a layout probe that raises (LEYLINE_VLLM_TEST_PROBE_FAULT): served, refused by name
    "probe_fault": Expected(refused="the layout probe failed (RuntimeError: injected by LEYLINE_VLLM_TEST_PROBE_FAULT)"),
}
CHECKPOINT_OF = {"probe_fault": "llama3"}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def family(request, tmp_path_factory):
    name = request.param
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp(f"ckpt-{name}"), CHECKPOINT_OF.get(name, name))
    env = {"LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS": NO_ROTATE,
           "LEYLINE_VLLM_TEST_WRONG_PAIRING_SESSIONS": WRONG_PAIRING, "LEYLINE_VLLM_DEBUG_ROUTES": "1",
           # mode auto: amortize below the threshold, but every amortized drift passes the budget of 0
           "LEYLINE_VLLM_AUTO": json.dumps({"signal_window": 32, "short_tail": 32, "forget_threshold": 1e9,
                                            "drift_budget": 0.0})}
    if name == "probe_fault":
        env["LEYLINE_VLLM_TEST_PROBE_FAULT"] = "1"
    # 32-token blocks (the CPU backend takes multiples of 32): the short test histories span several
    with VllmServer(checkpoint, tmp_path_factory.mktemp(f"serve-{name}"), env=env,
                    block_size=32) as server:
        print(f"\n{name}: vllm serve started in {server.startup_s:.0f} s ({server.dtype})")
        yield name, server


def fresh_reference(family, messages) -> list[dict]:
    """vLLM's own ``/v1/completions`` (no session, no plugin code) on the history's token ids, rendered by
    the checkpoint's chat template with transformers (vLLM's chat route renders gpt-oss with Harmony
    instead, so the ids would differ)."""
    name, server = family
    return fresh_completion(server.base_url, server.model, messages, EXPECTED[name].compared_tokens)


@pytest.fixture()
def client(family):
    with LeylineClient(family[1].base_url, timeout=600) as c:
        yield c


def splice(family) -> dict:
    return splice_info(family[1].base_url)


def test_the_connector_names_its_verdict(family):
    name, _ = family
    want, got = EXPECTED[name], splice(family)
    if want.refused:
        assert got["supported"] is False and want.refused in got["reason"], got
        return
    assert got["supported"] is True, got
    assert got["kind"] == "heads" and got["rope"] == want.rope and got["pair_layout"] == want.pair_layout, got
    head_size = got["row_width"] // 2
    assert (got["rotary_dim"] < head_size) == want.partial, got


def test_forget_equals_vllms_fresh_prefill(family, client):
    name, server = family
    old, s = history(), f"forget-{name}"
    client.create_session(old, session_id=s)
    (outcome,) = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT,
                                            mode="forget")]).outcomes
    assert outcome.applied_mode == "forget" and outcome.fallback_reason is None
    tol = TOLERANCE[server.dtype].logprob
    assert_same_generation(greedy(client, s, EXPECTED[name].compared_tokens),
                           fresh_reference(family, edited(old, 3, REPLACEMENT)), tol)


def _split(family, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer rows -> (the rotary dims of every K head, everything else: V and the non-rotary K dims)."""
    return split_rope(splice(family), table)


def _moved_layer0(family, client, session_id: str):
    """Amortize one edit in ``session_id``; the moved tokens' layer-0 rows and a fresh prefill's."""
    outcome = amortize_once(client, session_id)
    assert outcome.applied_mode == "amortize", outcome.fallback_reason
    assert outcome.rotated_tokens >= 64 and outcome.delta != 0
    return moved_layer0(client, family[1].base_url, session_id, outcome)


def test_amortize_layer0_rows_equal_a_fresh_prefill(family, client):
    name, server = family
    if EXPECTED[name].refused:
        pytest.skip(f"{name} is refused: nothing is rotated (see test_refused_family_applies_forget_with_reason)")
    rotary_err, rest_err = layer0_errors(splice(family), *_moved_layer0(family, client, f"amortize-{name}"))
    print(f"\n{name}: layer-0 rotary dims max error {rotary_err:.2e} (of the largest), other dims {rest_err:.2e}")
    assert rotary_err <= TOLERANCE[server.dtype].rotary and rest_err <= TOLERANCE[server.dtype].other


@pytest.mark.parametrize("control", [NO_ROTATE, WRONG_PAIRING])
def test_unrotated_or_wrongly_paired_splice_fails_the_check(family, client, control):
    name, _ = family
    if EXPECTED[name].refused:
        pytest.skip(f"{name} is refused: nothing is rotated")
    got, want = (_split(family, t) for t in _moved_layer0(family, client, control))  # the hooked session
    assert np.abs(got[1] - want[1]).max() <= 1e-2 * np.abs(want[1]).max()  # V and the rest still fine
    assert np.abs(got[0] - want[0]).max() > 0.1 * np.abs(want[0]).max()  # the rotary dims are not


def test_refused_family_applies_forget_with_reason(family, client):
    name, server = family
    if not EXPECTED[name].refused:
        pytest.skip(f"{name} is spliced: this test is for the refused families")
    old, s = history(), f"refused-{name}"
    client.create_session(old, session_id=s)
    (outcome,) = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT,
                                            mode="amortize")]).outcomes
    assert outcome.applied_mode == "forget" and outcome.rotated_tokens == 0
    assert outcome.fallback_reason.startswith("unsupported_runtime: ") and EXPECTED[name].refused in \
        outcome.fallback_reason
    tol = TOLERANCE[server.dtype].logprob
    assert_same_generation(greedy(client, s, EXPECTED[name].compared_tokens),
                           fresh_reference(family, edited(old, 3, REPLACEMENT)), tol)
    # auto (its window repair included) is refused the same way
    a = f"refused-auto-{name}"
    client.create_session(old, session_id=a)
    (auto,) = client.apply(a, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT, mode="auto")]).outcomes
    assert auto.applied_mode == "forget" and auto.rotated_tokens == 0, auto
    assert auto.fallback_reason.startswith("unsupported_runtime: ") and EXPECTED[name].refused in auto.fallback_reason


SHARED_SYSTEM = ("You are the operations agent of a harbour office. Tools: lookup_berth(ship) returns the berth "
                 "of a ship; list_cargo(ship) returns its manifest; weather(port) returns the forecast; "
                 "notify(crew, text) sends a message. Always answer in one short paragraph, name the tool you "
                 "used, and never invent a berth number. ") * 3


def test_exact_prefix_is_shared_spliced_rows_stay_private(family, client):
    """Sessions share the exact rows of a common system prompt (unsalted requests, vLLM's own prefix cache);
    a plain request for an amortized session's edited prompt reuses only its exact rows."""
    name, server = family
    if name != "qwen3":
        pytest.skip("checked on qwen3 only: which rows are shared is the plugin's rule, the same for every "
                    "standard-attention family")
    from leyline_sdk.protocol import Message

    def with_system(messages):
        return [Message(role="system", content=SHARED_SYSTEM)] + messages[1:]

    first = client.create_session(with_system(history()), session_id="shared-a")
    other = client.create_session(with_system(history()[:1] + history()[3:]), session_id="shared-b")
    system_tokens = first.segments[0].end
    block = 32
    assert other.counters.reused_tokens >= system_tokens - system_tokens % block > 0
    (outcome,) = client.apply("shared-a", [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT,
                                                     mode="amortize")]).outcomes
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens > 0
    first_moved = outcome.token_end + outcome.delta  # rows from here on were rotated (approximate)
    ids = chat_ids(server.model, edited(with_system(history()), 3, REPLACEMENT), generation_prompt=False)
    body = {"model": SERVED_MODEL_NAME, "prompt": list(ids), "max_tokens": 1, "temperature": 0}
    plain = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=600).json()
    cached = plain["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert system_tokens - system_tokens % block <= cached <= first_moved, (cached, first_moved)


def test_another_session_gets_no_spliced_rows(family, client):
    """Salt isolation on standard attention, where vLLM keeps its prefix cache on every CPU: a new
    session on the very edited history reuses at most the rows exact for its ids (before the first rotated
    one), and its rows above layer 0 are a fresh prefill's, not the spliced session's."""
    name, server = family
    if name != "qwen3":
        pytest.skip("checked on qwen3 only: salt isolation is the plugin's rule, the same for every "
                    "standard-attention family")
    old = history(tag=f"isolation-{uuid.uuid4().hex[:8]}")
    spliced = f"iso-{uuid.uuid4().hex[:8]}"
    outcome = amortize_once(client, spliced, old)
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens > 0, outcome
    other = client.create_session(edited(old, 3, REPLACEMENT), session_id=f"iso-other-{uuid.uuid4().hex[:8]}")
    first_moved = outcome.token_end + outcome.delta  # the rows before it are exact for the edited ids
    assert other.counters.reused_tokens <= first_moved, (other.counters.reused_tokens, first_moved)
    assert other.counters.prefilled_tokens == other.num_tokens - other.counters.reused_tokens
    mine, theirs = (rows(server.base_url, s, 1)[first_moved:] for s in (other.session_id, spliced))
    fresh = f"iso-fresh-{uuid.uuid4().hex[:8]}"
    client.create_session(edited(old, 3, REPLACEMENT), session_id=fresh)
    reference = rows(server.base_url, fresh, 1)[first_moved:]
    assert np.abs(mine - reference).max() <= 1e-2 * np.abs(reference).max()
    assert np.abs(theirs - reference).max() > 2e-2 * np.abs(reference).max()


def test_auto_past_the_drift_budget_recomputes_from_the_edit(family, client):
    """Mode auto amortizes (its drift is below the threshold), but the session's drift budget (0 on these
    servers) is passed: the turn re-prefills from the earliest drifted position, so the session is exact
    again (vLLM's own answer on the edited history) and the outcome says how many rows the repair took."""
    name, server = family
    if name != "qwen3":
        pytest.skip("checked on qwen3 only: the drift budget is the API server's rule, the same for every family")
    old, s = history(tag=f"budget-{uuid.uuid4().hex[:8]}"), f"budget-{uuid.uuid4().hex[:8]}"
    client.create_session(old, session_id=s)
    (outcome,) = client.apply(s, [Directive(span=Span(start=3, end=4), replacement=REPLACEMENT,
                                            mode="auto")]).outcomes
    decision = outcome.auto
    assert decision.choice == "amortize" and decision.layer1_change > 0, decision
    assert decision.drift_repair_tokens > 0 and decision.session_drift == 0.0, decision
    assert outcome.applied_mode == "forget" and outcome.rotated_tokens == 0, outcome
    tol = TOLERANCE[server.dtype].logprob
    assert_same_generation(greedy(client, s, EXPECTED[name].compared_tokens),
                           fresh_reference(family, edited(old, 3, REPLACEMENT)), tol)
