"""The erase edit set built from the shipped real sessions: each edit replaces one line of one tool output,
the replaced value is gone from everything the model sees, and only the corrected value answers its question."""

from __future__ import annotations

import pytest
import torch

from leyline_bench.drift.drift_real import load
from leyline_bench.drift.erase_edits import corrected_line, erase_histories, select_erase_edits
from leyline_bench.drift.real_edits import Renderer
from leyline_bench.drift.removed_content import answers
from leyline_bench.sessions.load import load_sessions


@pytest.fixture(scope="module")
def erase_set():
    render = Renderer(load("random-qwen2", torch.float32)[1])
    return select_erase_edits(erase_histories(render, load_sessions(), 3000, 600), 48)


def test_at_least_24_erase_edits_from_distinct_sessions(erase_set):
    assert len(erase_set) >= 24
    assert len({e.edit.history.session for e in erase_set}) >= 12


def test_each_erase_edit_replaces_one_line_of_one_tool_output(erase_set):
    for e in erase_set:
        old, new, i = e.edit.history.messages, e.edit.messages, e.edit.target
        assert len(old) == len(new) and new[-1] is old[-1] and new[i].role == "tool"
        assert [m.content for k, m in enumerate(old) if k != i] == [m.content for k, m in enumerate(new) if k != i]
        before, after = old[i].content.split("\n"), new[i].content.split("\n")
        assert len(before) == len(after) and sum(a != b for a, b in zip(before, after)) == 1


def test_only_the_corrected_value_answers_and_the_replaced_one_is_hidden(erase_set):
    for e in erase_set:
        (new_value,), (old_value,) = e.question.answers, e.removed
        shown = " ".join(" ".join(m.content.split()) for m in e.edit.messages)
        assert old_value not in shown and old_value not in e.question.text
        assert new_value in shown
        assert answers(e.question, new_value) and not answers(e.question, old_value)


def test_a_corrected_line_keeps_its_form():
    assert corrected_line("Ran 12 tests in 0.05s", None) == "Ran 19 tests in 7.12s"
    assert corrected_line("error: module frobnicator not found", "Widget") == "error: module Widget not found"
    assert corrected_line("nothing to do here", None) is None
