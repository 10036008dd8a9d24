"""``leyline-bench drift-agent``'s parts on a tiny random Qwen2 (nothing downloaded): the dependent repair
recomputes exactly through the turn end it is given and, given none inside the tail, is forget; the exact
tail recomputes only the last rows; the chunked floor is an exact prefill; the teacher-forced scores are
what they say; actions are read from a generated turn as an agent framework would run them."""

from __future__ import annotations

import json

import pytest
import torch

from leyline_bench.cli import main
from leyline_bench.drift.agent_action import Action, action_of, action_stops, command_word, same_word
from leyline_bench.drift.agent_case import assistant_ends, teacher_forced
from leyline_bench.drift.drift import load_model
from leyline_bench.drift.drift_oracle import diff, prefill, rope_slot
from leyline_bench.drift.drift_real import load
from leyline_bench.drift.real_edits import Renderer, candidates, histories
from leyline_bench.drift.real_modes import EXACT, answer_logprob, edited_rows
from leyline_bench.sessions.load import load_sessions
from leyline_runtime.auto_rule import AutoConfig


@pytest.fixture(scope="module")
def qwen():
    return load_model("random-qwen2")


@pytest.fixture(scope="module")
def edited(qwen):
    """History a + x + b edited to a + y + b, b of 220 tokens with a 'turn' ending 60 tokens into it."""
    g = torch.Generator().manual_seed(5)
    a, x, b = (torch.randint(10, 8000, (n,), generator=g).tolist() for n in (50, 30, 220))
    old, new = a + x + b, a + [7, 7, 7] + b
    e = diff(old, new)
    _, rows = prefill(qwen, old, 0, [])
    modes = ["amortize", "dependent-1", "dependent-2", "tail-32", "forget", "chunked-64"]
    turn_end = e.new_end + 60
    return new, e, turn_end, edited_rows(qwen, rows, new, e, rope_slot(qwen), AutoConfig(), modes, [turn_end])


def _gap(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _layers_gap(a, b, cols=slice(None)) -> float:
    return max(max(_gap(k[:, cols], rk[:, cols]), _gap(v[:, cols], rv[:, cols])) for (k, v), (rk, rv) in zip(a, b))


def test_a_dependent_window_over_the_whole_tail_is_forget(edited):
    """dependent-2 with one turn end after the edit recomputes every row after it: forget's rows and cost."""
    new, e, _, modes = edited
    assert _layers_gap(modes["dependent-2"].rows, modes["forget"].rows) < 1e-5
    assert _layers_gap(modes["dependent-2"].rows, modes[EXACT].rows) < 1e-5
    assert modes["dependent-2"].recomputed == modes["forget"].recomputed == len(new) - e.start


def test_dependent_recomputes_exactly_through_the_turn_and_rotates_the_rest(edited):
    new, e, turn_end, modes = edited
    dependent, exact = modes["dependent-1"].rows, modes[EXACT].rows
    assert _layers_gap(dependent, exact, slice(0, turn_end)) < 1e-5
    assert _gap(dependent[-1][0][:, turn_end:], exact[-1][0][:, turn_end:]) > 1e-3  # stale above layer 0 after it
    assert modes["dependent-1"].recomputed == modes["amortize"].recomputed + turn_end - e.new_end


def test_the_exact_tail_recomputes_the_last_rows_only(edited):
    new, e, _, modes = edited
    tail, amortized = modes["tail-32"].rows, modes["amortize"].rows
    assert _layers_gap(tail, amortized, slice(0, len(new) - 32)) == 0
    assert _gap(tail[-1][0][:, -32:], amortized[-1][0][:, -32:]) > 1e-4
    assert modes["tail-32"].recomputed == modes["amortize"].recomputed + 32


def test_the_chunked_floor_is_an_exact_prefill(edited):
    _, _, _, modes = edited
    assert _layers_gap(modes["chunked-64"].rows, modes[EXACT].rows) < 1e-5


def test_teacher_forced_scores_the_turn_and_the_kl_against_arm_0(qwen, edited):
    _, _, _, modes = edited
    arms = [modes[EXACT].rows, modes["amortize"].rows, modes["forget"].rows]
    header, turn = [21, 22], [31, 32, 33]
    logl, kl = teacher_forced(qwen, arms, header, turn)
    assert logl == pytest.approx(answer_logprob(qwen, arms, header, turn), abs=1e-4)
    assert kl[0] == pytest.approx(0, abs=1e-9) and kl[1] > 1e-7 and abs(kl[2]) < 0.01 * kl[1]  # forget is exact


def test_actions_are_read_as_a_framework_runs_them():
    call = 'THOUGHT: look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cd src &&  grep -n foo  x.py"}}\n</tool_call>'
    assert action_of(call) == Action("bash", "cd src && grep -n foo x.py", "grep")
    spaced = call.replace("grep -n foo  x.py", "grep -n foo x.py ")
    assert action_of(spaced) == action_of(call)
    assert action_of(call.replace("foo", "bar")) != action_of(call)
    assert same_word(action_of(call.replace("foo", "bar")), action_of(call))
    assert not same_word(action_of(call.replace("grep -n", "sed -n")), action_of(call))
    quick = '<|tool_call|>{"name": "bash", "arguments": "{\\"command\\": \\"ls -R\\"}"}<|end_tool_call|>'
    assert action_of(quick) == Action("bash", "ls -R", "ls")
    assert action_of("Run it:\n```bash\nFOO=1 /usr/bin/python -m pytest\n```") == Action(
        "bash", "FOO=1 /usr/bin/python -m pytest", "python")
    assert action_of("THOUGHT: I will <tool_call>{\"name\": \"bash\"").tool is None  # cut before it closed
    assert action_of('<tool_call>{"name": "edit", "arguments": {"path": "a", "text": "b"}}</tool_call>') == Action(
        "edit", '{"path": "a", "text": "b"}', "edit")
    prose = action_of("THOUGHT: first I will look around")
    assert not same_word(prose, action_of("THOUGHT: first I will read")) and same_word(prose, prose)
    assert command_word("cd /repo; cd sub && ls") == "ls" and command_word("echo 'unbalanced") == "echo"


def test_assistant_turn_ends_and_the_tool_call_stop():
    _, tok = load("random-qwen2", torch.float32)
    render = Renderer(tok)
    assert len(action_stops(tok, set())) == 1  # the quick template's <|end_tool_call|> is one token
    for s in load_sessions()[:10]:
        for kind, h in histories(render, s, 3000, 600).items():
            for e in candidates(h, kind)[:1]:
                new = render.ids(e.messages)
                edit = diff(h.tokens, new)
                ends = assistant_ends(render, e.messages, edit.new_end, 2)
                assert ends and ends == sorted(set(ends)) and edit.new_end < ends[0] and ends[-1] <= len(new)
                after = [m for m in e.messages[e.target:] if m.role == "assistant"]
                first = e.messages.index(after[0])
                assert ends[0] == len(render.ids(e.messages[:first + 1]))


@pytest.mark.slow  # drift-agent --quick (~17 s on 2 cores): make test-slow
def test_quick_run_reports_every_mode_and_the_floor(tmp_path):
    out = tmp_path / "out"
    assert main(["drift-agent", "--quick", "--threads", "1", "--sessions", "30", "--max-tokens", "3000",
                 "--out", str(out)]) == 0
    payload = json.loads((out / "drift_agent.json").read_text())
    s = payload["models"]["tiny-qwen2"]["summary"]
    assert s["edits"] == 4 and set(s["modes"]) == {"exact", "amortize", "dependent-1", "tail-16", "auto", "forget",
                                                   "chunked-256", "F"}
    assert s["modes"]["forget"]["share"] == 1 and s["modes"]["amortize"]["share"] < s["modes"]["dependent-1"]["share"]
    assert s["modes"]["forget"]["same_action"] == 1 and abs(s["modes"]["forget"]["kl_mean"]) < 1e-6
    assert (out / "drift_agent.png").exists() and "(the floor)" in (out / "drift_agent.md").read_text()
