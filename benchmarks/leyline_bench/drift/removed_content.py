"""Questions whose answer lives only in what an edit removed, built mechanically from the removed output.

For each (command, removed output) of an edit, in order, the first of these that the removed text
supports gives the question (a user message right after the edited history; the reply is greedy):

* ``exception`` — the exception or warning class names in it (``...Error``, ``...Exception``,
  ``...Warning``): "Which exception or warning class name appeared in the output of the command `X`?
  Answer with the class name only.";
* ``next_line`` — the first line of it (``MIN_LINE``–``MAX_LINE`` characters, a letter in it) that
  follows a line occurring once in the output: "In the output of the command `X`, which line came
  right after the line `P`? Answer with that line only." For a truncation ``P`` is the last line kept
  before the cut, so the question asks for the first line cut away.

A first version asked which path or file name an output held; the 0.5B model then named the most
salient path, one also in the command (3 tries, 0 of them a removed value, even from the unedited
history), so those kinds had several admissible answers and still measured salience, not recall.

A line's value is the line with whitespace runs as one space, without a leading ``./`` or a trailing
``:`` or ``/`` (``ls -R`` prints ``./pkg/sub:``; a reply naming ``pkg/sub`` has it). The answers are
the values that occur nowhere in the edited history's rendered text nor in the question (a value shown
elsewhere is answerable without the removed rows); a question needs one. A reply *answers* when it is
one (so normalised) or holds one as a whole word (``data/x`` is not in ``data/x/bin``). The unedited history (F)
gives the rate at which the model can answer at all; ``forget`` (the span gone from every row) the
rate of lucky guesses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

MAX_COMMAND_CHARS = 160
MIN_LINE, MAX_LINE = 8, 60
EXCEPTION = re.compile(r"\b[A-Z][A-Za-z0-9_]*(?:Error|Exception|Warning)\b")
MARKUP = re.compile(r"^</?(?:output|returncode|output_head|output_tail|elided_chars|warning)\b")


@dataclass(frozen=True)
class Question:
    kind: str
    text: str
    answers: tuple[str, ...]
    command: str


def short_command(command: str) -> str:
    """The command as a question quotes it: its first line, cut to ``MAX_COMMAND_CHARS``."""
    first = command.strip().split("\n", 1)[0]
    cut = first[:MAX_COMMAND_CHARS]
    return cut + (" ..." if cut != command.strip() else "")


def _flat(text: str) -> str:
    return " ".join(text.split())


def line_value(line: str) -> str:
    """A printed line as its answer is compared: spaces collapsed, quotes, ``./``, trailing ``:``/``/`` off."""
    return _flat(line).strip("`'\" ").rstrip(":/").removeprefix("./")


def _hidden(value: str, shown: str) -> bool:
    return _flat(value) not in shown


def exception_question(command: str, output: str, shown: str) -> Question | None:
    text = (f"Which exception or warning class name appeared in the output of the command `{short_command(command)}`? "
            "Answer with the class name only.")
    found = tuple(v for v in dict.fromkeys(EXCEPTION.findall(output)) if _hidden(v, shown + " " + _flat(text)))
    return Question("exception", text, found, command) if found else None


def next_line_question(command: str, output: str, shown: str) -> Question | None:
    lines = [line.strip() for line in output.split("\n")]
    for prev, line in pairwise(lines):
        if not prev or lines.count(prev) != 1 or MARKUP.match(prev) or MARKUP.match(line):
            continue
        value = line_value(line)
        if not (MIN_LINE <= len(value) <= MAX_LINE and re.search("[A-Za-z]", value)):
            continue
        text = (f"In the output of the command `{short_command(command)}`, which line came right after the line "
                f"`{prev}`? Answer with that line only.")
        if _hidden(value, shown + " " + _flat(text)):
            return Question("next_line", text, (value,), command)
    return None


def question_for(removed: list[tuple[str, str]], edited_text: str) -> Question | None:
    """The first question the removed outputs support, or None."""
    shown = _flat(edited_text)
    for command, output in removed:
        if not command:
            continue
        for build in (exception_question, next_line_question):
            question = build(command, output, shown)
            if question is not None:
                return question
    return None


def answers(question: Question, reply: str) -> bool:
    """Whether ``reply`` is one of the question's answers or holds one as a whole word."""
    flat, whole = _flat(reply), line_value(reply)
    return any(whole == v or re.search(rf"(?<![\w/.-]){re.escape(v)}(?![\w/-]|\.\w)", flat) for v in question.answers)
