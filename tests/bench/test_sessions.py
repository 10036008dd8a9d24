"""Real agent sessions: the mini-swe-agent converter, the shipped sessions, the cache-break summary."""

from __future__ import annotations

import hashlib
import json
import re
import socket
from pathlib import Path

import pytest

from leyline_bench.sessions import stats
from leyline_bench.sessions.cache_breaks import load_folder, summarise, trace_breaks
from leyline_bench.sessions.convert import convert_messages, convert_trajectory, last_call_prompt_tokens
from leyline_bench.sessions.load import SESSIONS_FILE, load_sessions
from leyline_bench.sessions.split import split_of
from leyline_sdk.protocol import Message

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
SYSTEM = {"role": "system", "content": "You are a helpful assistant that can interact with a computer shell."}
TASK = {"role": "user", "content": "<pr_description>\nFix the bug.\n</pr_description>"}
FORMAT_ERROR = "Please always provide EXACTLY ONE action in triple backticks, found 0 actions."
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"


def trajectory(*turns: dict) -> dict:
    return {"trajectory_format": "mini-swe-agent-1", "instance_id": "demo__demo-1",
            "messages": [SYSTEM, TASK, *turns], "info": {"exit_status": "Submitted"}}


def said(text: str, tokens: int | None = None) -> dict:
    extra = {"response": {"usage": {"prompt_tokens": tokens}}} if tokens is not None else {}
    return {"role": "assistant", "content": text, "extra": extra}


def heard(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_bash_block_becomes_a_tool_call_and_its_observation_a_tool_message():
    out = convert_trajectory(trajectory(
        said("THOUGHT: list the files first.\n\n```bash\n  ls -la\n```"),
        heard("<returncode>0</returncode>\n<output>\nsetup.py\n</output>"),
        said(f"THOUGHT: done.\n\n```bash\n{SUBMIT}\n```"),
        heard("diff --git a/x.py b/x.py\n")))
    assert out[:2] == [SYSTEM, TASK]
    first, result, submit, submission = out[2:]
    assert first["role"] == "assistant" and first["content"] == "THOUGHT: list the files first."
    [call] = first["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la"}
    assert result == {"role": "tool", "tool_call_id": call["id"],
                      "content": "<returncode>0</returncode>\n<output>\nsetup.py\n</output>"}
    assert submission == {"role": "tool", "tool_call_id": submit["tool_calls"][0]["id"],
                          "content": "diff --git a/x.py b/x.py\n"}
    assert call["id"] != submit["tool_calls"][0]["id"]
    assert all(isinstance(Message.model_validate(m), Message) for m in out)


def test_prose_after_the_block_is_kept_and_only_the_fence_goes():
    [message] = convert_messages([SYSTEM, TASK, said("Before.\n\n```bash\ngrep -n 'a\\|b' f.py\n```\n\nAfter it.\n")])[2:]
    assert message["content"] == "Before.\n\nAfter it."
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["command"] == "grep -n 'a\\|b' f.py"


def test_a_turn_without_a_bash_block_stays_a_plain_message_and_its_format_error_a_user_message():
    text = "THOUGHT: I think the fix is complete."
    out = convert_trajectory(trajectory(said(text), heard(FORMAT_ERROR),
                                        said("```bash\nls\n```"), heard("<returncode>0</returncode>\n<output>\n</output>")))
    assert out[2] == {"role": "assistant", "content": text}
    assert out[3] == {"role": "user", "content": FORMAT_ERROR}
    assert out[4]["tool_calls"][0]["id"] == out[5]["tool_call_id"] == "call_0"


def test_several_bash_blocks_run_nothing_so_the_turn_stays_plain():
    text = "First:\n```bash\nls\n```\nThen:\n```bash\ncat f\n```"
    error = FORMAT_ERROR.replace("found 0", "found 2")
    assert convert_trajectory(trajectory(said(text), heard(error)))[2:] == [
        {"role": "assistant", "content": text}, {"role": "user", "content": error}]


def test_elided_and_timed_out_outputs_are_kept_verbatim():
    elided = ("<returncode>0</returncode>\n<warning>\nThe output of your last command was too long.\n</warning>"
              "<output_head>\n" + "a" * 5000 + "\n</output_head>\n<elided_chars>\n1234 characters elided\n"
              "</elided_chars>\n<output_tail>\n" + "z" * 5000 + "\n</output_tail>")
    timeout = "The last command <command>sleep 100</command> timed out and has been killed.\n<output>\n\n</output>"
    out = convert_trajectory(trajectory(said("```bash\ncat big.log\n```"), heard(elided),
                                        said("```bash\nsleep 100\n```"), heard(timeout)))
    assert [(m["role"], m["content"]) for m in out[3::2]] == [("tool", elided), ("tool", timeout)]


def test_other_formats_and_shapes_are_refused():
    with pytest.raises(ValueError, match="trajectory_format"):
        convert_trajectory({**trajectory(), "trajectory_format": "swe-agent"})
    with pytest.raises(ValueError, match="'assistant' where mini-swe-agent writes 'user'"):
        convert_messages([SYSTEM, TASK, said("```bash\nls\n```"), said("```bash\npwd\n```")])
    with pytest.raises(ValueError, match="starts with a system"):
        convert_messages([TASK, SYSTEM])


def test_last_call_prompt_tokens_is_the_last_assistant_turns_usage():
    assert last_call_prompt_tokens(trajectory(said("```bash\nls\n```", 100), heard("<returncode>0</returncode>"),
                                              said("```bash\nls\n```", 250), heard("done"))) == 250
    assert last_call_prompt_tokens(trajectory(said("```bash\nls\n```"), heard("x"))) is None


@pytest.fixture(scope="module")
def shipped():
    return {"heldout": load_sessions("heldout"), "calibration": load_sessions("calibration")}


def test_the_shipped_file_loads_offline(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the sessions must load without the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    sessions = load_sessions("calibration")
    assert sessions and all(isinstance(m, Message) for s in sessions for m in s.messages)
    with pytest.raises(ValueError, match="split"):
        load_sessions("test")  # type: ignore[arg-type]


def test_the_split_follows_the_sha1_rule_and_the_selection_is_in_sha1_order(shipped):
    assert len(shipped["heldout"]) >= 60 and len(shipped["calibration"]) >= 8
    for split, sessions in shipped.items():
        for s in sessions:
            digest = hashlib.sha1(s.instance_id.encode()).hexdigest()
            assert s.sha1 == digest
            assert (int(digest, 16) % 10 == 0) == (split == "calibration") and s.split == split == split_of(s.instance_id)
            assert s.source_path == (f"swebench_results/20251118_gemini-3-pro-74pct/trajs/"
                                     f"{s.instance_id}/{s.instance_id}.traj.json")
            assert re.fullmatch(r"[0-9a-f]{40}", s.source_commit)
        assert [s.sha1 for s in sessions] == sorted(s.sha1 for s in sessions)
        assert len({s.instance_id for s in sessions}) == len(sessions)


def test_every_shipped_session_follows_the_mapping(shipped):
    """On the real sessions: each call answered once by its own tool message, plain turns by a format error."""
    for s in shipped["heldout"] + shipped["calibration"]:
        m = s.messages
        assert [x.role for x in m[:2]] == ["system", "user"] and m[-1].role == "tool"
        commands = {}
        for before, after in zip(m[2::2], m[3::2]):
            assert before.role == "assistant"
            if before.tool_calls:
                [call] = before.tool_calls
                commands[call.id] = json.loads(call.function.arguments)["command"]
                assert after.role == "tool" and after.tool_call_id == call.id
                assert after.content.startswith(("<returncode>", "The last command <command>")) or after is m[-1]
                quoted = re.match(r"The last command <command>(.*?)</command> timed out", after.content, re.DOTALL)
                assert quoted is None or quoted.group(1) == commands[call.id]  # a timeout quotes what ran
            else:
                assert after.role == "user" and after.content.startswith("Please always provide EXACTLY ONE action")
        assert len(commands) == sum(x.role == "tool" for x in m)
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in commands[m[-1].tool_call_id]


def test_licences_and_provenance_are_shipped_and_provenance_holds_the_current_statistics():
    assert SESSIONS_FILE.is_file() and SESSIONS_FILE.stat().st_size < 8_000_000
    mit = (DATA / "mini_swe_agent" / "LICENSE").read_text()
    assert mit.startswith("MIT License") and "Permission is hereby granted, free of charge" in mit
    apache = (DATA / "kv_cache_tester" / "LICENSE").read_text()
    assert "Apache License" in apache and "Version 2.0, January 2004" in apache
    provenance = (DATA / "mini_swe_agent" / "PROVENANCE.md").read_text()
    assert "gruckion/mini-swe-agent" in provenance and stats.report() in provenance
    assert "callanjfox/kv-cache-tester" in (DATA / "kv_cache_tester" / "PROVENANCE.md").read_text()


def block_trace(*requests: list[int], subagent_at: int | None = None) -> dict:
    reqs: list[dict] = [{"in": len(ids) * 64 + 10, "hash_ids": ids} for ids in requests]
    if subagent_at is not None:
        reqs.insert(subagent_at, {"type": "subagent", "requests": [{"in": 64, "hash_ids": [99]}]})
    return {"block_size": 64, "requests": reqs}


def test_cache_breaks_count_only_lost_prefix_blocks_beyond_the_last_one():
    appends = trace_breaks("a", block_trace([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5, 6], subagent_at=1))
    assert appends.transitions == 2 and appends.breaks == [] and appends.end_context_tokens == 5 * 64 + 10
    edited = trace_breaks("b", block_trace([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 10, 11, 12, 13, 14, 15],
                                           [1, 2, 9]))
    first, second = edited.breaks
    assert (first.kept_share, first.dropped_tokens, first.shrinking) == (0.25, 6 * 64, False)
    assert (second.kept_share, second.dropped_tokens, second.shrinking) == (3 / 9, 6 * 64, True)
    summary = summarise([appends, edited])
    assert summary["transitions"] == 4 and summary["breaks"] == 2 and summary["break_share"] == 0.5


def test_the_shipped_cache_break_summary_is_consistent(tmp_path):
    summary = json.loads((DATA / "kv_cache_tester" / "cache_breaks.json").read_text())
    sample = summary["first_60"]
    assert sample["traces"] == len(sample["files"]) == 60 and summary["all"]["traces"] >= 60
    for part in (sample, summary["all"]):
        assert part["break_share"] == part["breaks"] / part["transitions"]
    (tmp_path / "trace_0001.json").write_text(json.dumps(block_trace([1, 2, 3], [1, 2, 3, 4])))
    assert [t.name for t in load_folder(tmp_path)] == ["trace_0001.json"]
