"""``leyline-bench traces`` without a server: the policies on hand-written histories, the floor, the
turns a session replays, the cache-break arithmetic and the report's sums (all in ``make test``)."""

from __future__ import annotations

import json
import random

import pytest
from leyline_bench.traces.breaks import arm_recompute, break_cases, load_summary
from leyline_bench.traces.floor import lcs_length, prefix_cache_computed, stream_floors, turn_floors
from leyline_bench.traces.gguf import gguf_name
from leyline_bench.traces.policies import (
    SUMMARY_CHARS,
    TRUNCATE_HEAD,
    TRUNCATE_TAIL,
    make_policy,
    scaled,
)
from leyline_bench.traces.report import add_ratios, summarise
from leyline_bench.traces.turns import extends, raw_calls, replay_policy

from leyline_sdk.protocol import FunctionCall, Message, ToolCall

CAP = 8192


def call(n: int, command: str = "ls") -> Message:
    return Message(role="assistant", content=f"THOUGHT: step {n}",
                   tool_calls=[ToolCall(id=f"call_{n}", function=FunctionCall(
                       name="bash", arguments=json.dumps({"command": command})))])


def output(n: int, lines: int = 3, width: int = 20) -> Message:
    body = "\n".join(f"<returncode>0</returncode> line {i} of {n} " + "x" * width for i in range(lines))
    return Message(role="tool", tool_call_id=f"call_{n}", content=body)


def session(rounds: int, lines: int = 3, width: int = 20) -> list[Message]:
    messages = [Message(role="system", content="You are a shell agent."), Message(role="user", content="Fix the bug.")]
    for n in range(rounds):
        messages += [call(n), output(n, lines, width)]
    return messages


# -- the floor ----------------------------------------------------------------------------------------

def _lcs_table(a, b) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_lcs_equals_the_dynamic_programming_table():
    rng = random.Random(7)
    for _ in range(200):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        b = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        assert lcs_length(a, b) == _lcs_table(a, b), (a, b)


def test_floor_counts_appended_and_changed_tokens_only():
    base = list(range(100))
    appended = base + [500, 501, 502]
    replaced = base[:40] + [900, 901] + base[60:] + [500, 501, 502]  # 20 tokens become 2, 3 appended
    deleted = base[:40] + base[60:] + [500, 501, 502]
    assert turn_floors([base, appended]) == [100, 3]
    assert turn_floors([base, replaced]) == [100, 5]
    assert turn_floors([base, deleted]) == [100, 3]


def test_a_sessions_first_call_is_charged_beyond_the_prefix_it_shares_with_the_previous_session():
    system = [1, 2, 3, 4]
    first = [system + [10, 11], system + [10, 11, 12]]
    second = [system + [20, 21, 22], system + [20, 21, 22, 23]]
    assert stream_floors([first, second]) == [[6, 1], [3, 1]]


def test_a_prefix_cache_reuses_whole_blocks_of_the_previous_requests_prefix_and_computes_the_last_token():
    base = list(range(100))
    appended = base + [500, 501, 502]
    replaced = base[:40] + [900, 901] + base[60:]
    again = list(replaced)
    # block 32: 96 of the 100 shared tokens are whole blocks; an edit at 40 keeps one block (32);
    # a repeated 82-token prompt reuses whole blocks short of its last token (81 -> 64), computing 18
    assert prefix_cache_computed([[base, appended, replaced, again]], 32) == [[100, 7, 50, 18]]
    assert prefix_cache_computed([[base, appended]], 1) == [[100, 3]]
    # sessions chain: the second session's first call shares the first one's last call's prefix
    assert prefix_cache_computed([[base], [base[:64] + [7]]], 32) == [[100], [1]]


# -- the policies -------------------------------------------------------------------------------------

def test_append_only_sends_the_raw_history():
    raw = session(4)
    assert make_policy("append_only", CAP).sent(raw) == raw


def test_langchain_clear_clears_all_but_the_last_three_outputs_past_its_trigger():
    policy = make_policy("langchain_clear", CAP)
    assert policy.edit.trigger == scaled(100_000, CAP) == 4096
    small = session(6)
    assert policy.sent(small) == small  # far below the trigger: untouched
    big = session(6, lines=40, width=60)  # ~ 6 x 40 x 90 chars: past 4096 approximate tokens
    sent = policy.sent(big)
    tools = [m for m in sent if m.role == "tool"]
    assert [m.content for m in tools[:3]] == ["[cleared]"] * 3
    assert tools[3:] == [m for m in big if m.role == "tool"][3:]
    untouched = [a for a, b in zip(big, sent) if a.role != "tool"]
    assert all(a is b for a, b in zip(untouched, [b for a, b in zip(big, sent) if a.role != "tool"]))


def test_ten_line_truncation_cuts_every_long_output_but_the_newest():
    raw = session(3, lines=25)
    raw[3] = output(0, lines=10)  # ten lines: kept as it is
    sent = make_policy("ten_line_truncation", CAP).sent(raw)
    assert sent[3] is raw[3]
    lines = sent[5].content.split("\n")
    assert len(lines) == TRUNCATE_HEAD + 1 + TRUNCATE_TAIL and lines[TRUNCATE_HEAD] == "[... 15 lines truncated ...]"
    assert lines[:TRUNCATE_HEAD] == raw[5].content.split("\n")[:TRUNCATE_HEAD]
    assert sent[7] is raw[7]  # the newest output, read whole


def test_summarization_replaces_all_but_the_last_20_messages_and_keeps_its_state():
    policy = make_policy("langchain_summarize", CAP)
    raw = session(14, lines=12, width=80)  # 30 messages, past 4000 approximate tokens
    sent = policy.sent(raw)
    assert sent[0] is raw[0]  # the system prompt stays apart, as create_agent keeps it
    summary = sent[1]
    assert summary.role == "user" and summary.content.startswith("Here is a summary of the conversation to date:\n\n")
    assert len(summary.content) == len("Here is a summary of the conversation to date:\n\n") + SUMMARY_CHARS
    assert sent[2:] == raw[-20:] and sent[2].role == "assistant"  # the cut keeps each call with its output
    later = policy.sent(raw + [call(14), output(14, 1)])  # the state persists: the summary is there next call
    assert later[1].content.startswith("Here is a summary") and later[-2:] == [call(14), output(14, 1)]


def test_anthropic_clear_is_the_runtimes_edit_and_its_request_field():
    from leyline_runtime.api.context_edits import PLACEHOLDER

    policy = make_policy("anthropic_clear", CAP)
    edit = policy.context_management["edits"][0]
    assert edit["trigger"]["value"] == scaled(30_000, CAP) and edit["clear_at_least"]["value"] == scaled(5_000, CAP)
    raw = session(6, lines=30, width=60)
    tools = [m.content for m in policy.sent(raw) if m.role == "tool"]
    assert tools[:3] == [PLACEHOLDER] * 3 and PLACEHOLDER not in tools[3:]


def test_anthropic_clear_keeps_every_result_while_there_are_fewer_than_keep():
    # Past the trigger with 2 tool results and keep = 3: nothing to clear (a negative slice start once kept only
    # the newest, clearing a result the next call, with 3 of them, brought back)
    policy = make_policy("anthropic_clear", CAP)
    raw = session(2, lines=400, width=60)
    assert policy.sent(raw) == raw
    assert policy.sent(session(6, lines=400, width=60)) != session(6, lines=400, width=60)


def test_unknown_policy_is_named():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("clear_everything", CAP)


# -- the turns ----------------------------------------------------------------------------------------

def test_raw_calls_are_the_histories_before_each_assistant_message_within_the_budget():
    messages = session(5)
    count = lambda history: 10 * len(history)  # noqa: E731
    calls = raw_calls(messages, count, cap=60)
    assert [len(h) for h in calls] == [2, 4, 6]  # 8 messages would be 80 > 60
    assert raw_calls(messages, count, cap=1000, max_turns=2) == calls[:2]


def test_replay_marks_the_calls_whose_history_was_edited():
    raw = raw_calls(session(6, lines=40, width=60), lambda h: 0, cap=10)
    replay = replay_policy("s", raw, make_policy("langchain_clear", CAP))
    assert replay.edited_turns and all(not extends(replay.sent[t - 1], replay.sent[t]) for t in replay.edited_turns)
    assert replay_policy("s", raw, make_policy("append_only", CAP)).edited_turns == []


# -- cache breaks, GGUF names, the report's sums -----------------------------------------------------

def test_cache_break_rules():
    r = arm_recompute(tail=50_000, changed=10, block=32)
    assert r["vllm_plain"] == r["llama_cpp"] == 50_010 and r["leyline_amortize"] == 74
    assert arm_recompute(tail=50_000, changed=0)["llama_cpp"] == 0  # a pure deletion: llama.cpp shifts the tail
    cases = break_cases(load_summary())
    assert cases["median_position"]["context"] > 100_000
    position = cases["median_position"]
    assert position["tail"] + position["position"] == position["context"]


def test_gguf_names():
    assert gguf_name("model.layers.11.self_attn.k_norm.weight") == "blk.11.attn_k_norm.weight"
    assert gguf_name("lm_head.weight") == "output.weight"
    with pytest.raises(ValueError):
        gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq")


def _turn(session, turn, computed, floor, latency, edited=False):
    return {"session": session, "turn": turn, "computed": computed, "prompt": 100, "expected_prompt": 100,
            "floor": floor, "latency_s": latency, "prefill_s": latency / 2, "edited": edited}


def test_summaries_and_ratios():
    plain = summarise([_turn("a", 0, 100, 100, 1.0), _turn("a", 1, 60, 10, 0.8, True)])
    leyline = summarise([_turn("a", 0, 100, 100, 1.0), _turn("a", 1, 12, 10, 0.1, True)])
    summaries = {("m", "p", "vllm_plain"): plain, ("m", "p", "leyline_amortize"): leyline}
    add_ratios(summaries)
    assert leyline["computed"] == 112 and leyline["computed_over_floor"] == pytest.approx(112 / 110)
    assert leyline["plain_over_arm_tokens"] == pytest.approx(160 / 112)
    assert (leyline["computed_edited"], leyline["floor_edited"]) == (12, 10)
    assert leyline["llama_over_arm_tokens"] is None and leyline["prefill_s"] == pytest.approx(0.55)
