"""Erase edits from real agent sessions: a tool output replaced by a corrected one, with a question only the
corrected value answers.

A *shrink* (:mod:`.real_edits`: clear, truncate, drop, summary) removes what the agent no longer needs;
whether the model keeps notes about it is harmless or not. An *erase* replaces content that must stop
influencing the model: a tool result corrected, a retracted answer. So each erase edit comes with a
question whose right answer is the new value and whose stale answer is the value replaced:

* the edit (kind ``replace``): in one tool output of the history (never the last round, as for the
  shrink kinds), one line ``L`` that follows a line ``P`` occurring once in that output becomes a
  corrected line ``L'``;
* the question: "In the output of the command `X`, which line came right after the line `P`? Answer
  with that line only." (the ``next_line`` question of :mod:`.removed_content`);
* ``answers``: the value of ``L'`` (the corrected output shows it, nothing else in the history does);
  ``removed``: the value of ``L`` (it occurs nowhere in the edited history nor in the question). A reply
  holding ``removed`` answers from rows the edit should have erased.

The corrected line is ``L`` with its numbers changed (each digit run ``n`` becomes ``n + 7``, so
``Ran 12 tests`` becomes ``Ran 19 tests`` and ``line 40`` becomes ``line 47``), or, where ``L`` has no
digit, its longest word swapped for the longest word of the next eligible line of another session (so
``ImportError: cannot import name 'Foo'`` may become ``ImportError: cannot import name 'collections'``):
a value of the same form, plausible in place, and one the model cannot have seen in that output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Iterator
from itertools import pairwise

from .real_edits import History, RealEdit, command_of, cut_history
from .removed_content import MARKUP, MAX_LINE, MIN_LINE, Question, line_value, short_command

KIND = "replace"
DIGITS = re.compile(r"\d+")
WORD = re.compile(r"[A-Za-z_][A-Za-z_]{3,}")
# not a donor: ``ls -l`` permission strings and dunder names, which read as a wrong kind of value in most lines
NOT_DONOR = re.compile(r"^(?:[-dlrwxst]{10}|__\w*__)$")
SHIFT = 7
PER_MESSAGE = 3
LATER_STARTS = (0, 2)  # the rounds a session's histories start at


@dataclass(frozen=True)
class EraseEdit:
    edit: RealEdit
    question: Question  # its answers: the corrected value
    removed: tuple[str, ...]  # the replaced value: a reply holding it answers from erased content


def _flat(text: str) -> str:
    return " ".join(text.split())


def corrected_line(line: str, donor_word: str | None) -> str | None:
    """``line`` with its numbers shifted, or its longest word swapped for ``donor_word``; None if neither
    changes it."""
    if DIGITS.search(line):
        return DIGITS.sub(lambda m: str(int(m.group()) + SHIFT).zfill(len(m.group())), line)
    words = WORD.findall(line)
    if not words or donor_word is None:
        return None
    longest = max(words, key=len)
    if donor_word == longest:
        return None
    return re.sub(rf"(?<![A-Za-z_]){re.escape(longest)}(?![A-Za-z_])", donor_word, line, count=1)


def _eligible(prev: str, line: str, lines: list[str]) -> bool:
    value = line_value(line)
    return bool(prev) and lines.count(prev) == 1 and not MARKUP.match(prev) and not MARKUP.match(line) \
        and MIN_LINE <= len(value) <= MAX_LINE and bool(re.search("[A-Za-z]", value))


def _rendered(messages) -> str:
    return _flat(" ".join(part for m in messages for part in (m.content, command_of(m)) if part))


def replacements(h: History, i: int, donor_word: str | None) -> Iterator[EraseEdit]:
    """The erase edits of ``h.messages[i]``: one per line that can be corrected and asked about."""
    m = h.messages[i]
    command = command_of(h.messages[i - 1]) if m.role == "tool" else ""
    if not command:
        return
    lines = [line.strip() for line in m.content.split("\n")]
    raw = m.content.split("\n")
    for k, (prev, line) in enumerate(pairwise(lines), start=1):
        if not _eligible(prev, line, lines):
            continue
        new_line = corrected_line(line, donor_word)
        if new_line is None or line_value(new_line) == line_value(line) or not _eligible(prev, new_line, lines):
            continue
        content = "\n".join(raw[:k] + [raw[k].replace(line, new_line, 1)] + raw[k + 1:])
        messages = h.messages[:i] + [m.model_copy(update={"content": content})] + h.messages[i + 1:]
        text = (f"In the output of the command `{short_command(command)}`, which line came right after the line "
                f"`{prev}`? Answer with that line only.")
        shown, old, new = _rendered(messages) + " " + _flat(text), line_value(line), line_value(new_line)
        # the stale value must be gone from everything the model sees; the new one shown once, in the output
        if _flat(old) in shown or shown.count(_flat(new)) != 1:
            continue
        edit = RealEdit(h, KIND, i, messages, [(command, m.content)])
        yield EraseEdit(edit, Question("next_line", text, (new,), command), (old,))


def donor_words(histories: list[History]) -> list[str]:
    """One word per eligible line of the histories' tool outputs, in order: the longest word of each."""
    out = []
    for h in histories:
        for m in h.messages:
            if m.role != "tool":
                continue
            lines = [line.strip() for line in m.content.split("\n")]
            for prev, line in pairwise(lines):
                words = [w for w in WORD.findall(line) if not NOT_DONOR.match(w)]
                if words and _eligible(prev, line, lines):
                    out.append(max(words, key=len))
    return out


def erase_candidates(h: History, donors: list[str], per_message: int = PER_MESSAGE) -> list[EraseEdit]:
    """Erase edits the history admits, in message order, at most ``per_message`` of one output (its first,
    middle and last, so the replaced line sits at different depths); never the system or task message,
    never the last round. Donor words are taken from ``donors`` (another session's) in turn."""
    out = []
    for i in range(2, len(h.messages) - 1):
        donor = donors[len(out) % len(donors)] if donors else None
        found = list(replacements(h, i, donor))
        picks = sorted({0, len(found) // 2, len(found) - 1})[:per_message] if found else []
        out += [found[k] for k in picks]
    return out


def erase_histories(render, sessions, max_tokens: int, turn_tokens: int) -> list[History]:
    """Each session's history from its beginning and one from its third round on (the earlier rounds left
    out, as for ``drop``): a 3k-token history holds two to four rounds, often the first a directory listing."""
    return [h for first_round in LATER_STARTS for s in sessions
            if (h := cut_history(render, s, max_tokens, turn_tokens, first_round=first_round)) is not None]


def select_erase_edits(histories: list[History], count: int, per_history: int = 3) -> list[EraseEdit]:
    """``count`` erase edits, at most ``per_history`` from each history, sessions in turn; each history's
    donor words come from the next history (the last one's from the first)."""
    per: list[list[EraseEdit]] = []
    for j, h in enumerate(histories):
        donors = donor_words([histories[(j + 1) % len(histories)]]) if len(histories) > 1 else []
        per.append(erase_candidates(h, donors)[:per_history])
    chosen: list[EraseEdit] = []
    for depth in range(per_history):
        chosen += [edits[depth] for edits in per if depth < len(edits)]
    return chosen[:count]
