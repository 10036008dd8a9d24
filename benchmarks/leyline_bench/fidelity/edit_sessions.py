"""Agent-like multi-edit sessions: a history, then per step one edit batch and one new turn.

The edits cycle through what agents do to their context (clear an old tool output,
drop a tool attempt, insert a note, truncate a long output, summarise a run of old
messages); the recent messages are never edited (like ``ClearToolUsesEdit(keep=3)``).
When the history passes ``cap`` tokens the step's edit is a compaction (a summary of
the oldest ~30%). Every step then appends the next tool round of a held-out
transcript, which is the *next turn* the fidelity bench scores. Everything is a pure
function of the seed, computed on message lists (every policy sees the same history).
"""

from __future__ import annotations

from dataclasses import dataclass

from leyline_sdk import apply_directives
from leyline_sdk.protocol import Directive, Message, Span

from leyline_runtime.text.tokenizer import ChatTokenizer
from ..common import agent_text
from ..common.histories import PLACEHOLDER

KINDS = ("clear", "drop", "insert", "truncate", "summary")
PROTECTED_TAIL = 3  # the last messages are never edited
TRUNCATE_LINES = 5
ROUND_SEED0 = 20000  # next-turn rounds come from their own transcripts
NOTE_SEED0 = 30000


@dataclass
class Step:
    kind: str
    directives: list[Directive]  # one batch, addressing the history before it
    next_turn: list[Message]  # appended after the edit


@dataclass
class EditSession:
    name: str
    history: list[Message]
    steps: list[Step]


def build_session(tok: ChatTokenizer, seed: int, edits: int = 20, start_tokens: int = 1200,
                  cap: int = 2400) -> EditSession:
    history = [agent_text.system()]
    prior = 5000 + 97 * seed
    while _size(tok, history) < start_tokens:
        history += agent_text.conversation(prior)
        prior += 1
    rounds = agent_text.round_stream(ROUND_SEED0 + 50 * seed)
    messages, steps = list(history), []
    for i in range(edits):
        kind = "compact" if _size(tok, messages) > cap else None
        directives = None
        for k in ([kind] if kind else []) + [KINDS[(i + j) % len(KINDS)] for j in range(len(KINDS))]:
            directives = EDITS[k](tok, messages, seed * 1000 + i)
            if directives:
                kind = k
                break
        if not directives:
            raise ValueError(f"no edit applies to step {i} of session {seed}: start from a longer history")
        messages = apply_directives(messages, directives)
        r = next(rounds)
        turn = [r.call.model_copy(deep=True), r.output.model_copy(deep=True)]
        messages += turn
        steps.append(Step(kind, directives, turn))
    return EditSession(f"session_{seed}", history, steps)


def _size(tok: ChatTokenizer, messages: list[Message]) -> int:
    return sum(map(len, tok.encode_messages(messages)))


def _editable(messages: list[Message]) -> range:
    return range(1, len(messages) - PROTECTED_TAIL)


def _one(i: int, j: int, replacement: list[Message]) -> list[Directive]:
    return [Directive(span=Span(start=i, end=j), replacement=replacement)]


def clear(tok, messages, seed) -> list[Directive] | None:
    """The oldest tool output not cleared yet."""
    for i in _editable(messages):
        m = messages[i]
        if m.role == "tool" and m.content != PLACEHOLDER and len(tok.encode(m.content)) > 8:
            return _one(i, i + 1, [m.model_copy(update={"content": PLACEHOLDER})])
    return None


def drop(tok, messages, seed) -> list[Directive] | None:
    """A single-call tool round: a failed one if any, else the oldest."""
    rounds = [i for i in _editable(messages)[:-1]
              if messages[i].role == "assistant" and messages[i].tool_calls and len(messages[i].tool_calls) == 1
              and messages[i + 1].role == "tool" and messages[i + 1].tool_call_id == messages[i].tool_calls[0].id]
    failed = [i for i in rounds if messages[i + 1].content.startswith("Error")]
    pick = (failed or rounds or [None])[0]
    return None if pick is None else _one(pick, pick + 2, [])


def insert(tok, messages, seed) -> list[Directive] | None:
    """A retrieved note in the middle of the history: short or long (~40 / ~250 tokens)."""
    editable = _editable(messages)
    if len(editable) < 2:
        return None
    at = editable[len(editable) // 2]
    while at > 1 and messages[at - 1].role == "assistant" and messages[at - 1].tool_calls:
        at -= 1  # never between a call and its output
    out = next((r.output.content for r in agent_text.rounds(NOTE_SEED0 + seed) if not r.failed), "nothing found")
    lines = out.split("\n")[: 3 if seed % 2 == 0 else 25]
    note = Message(role="user", content="Note from memory (earlier session):\n" + "\n".join(lines))
    return [Directive(span=Span(start=at, end=at), replacement=[note])]


def truncate(tok, messages, seed) -> list[Directive] | None:
    """The newest long tool output cut to its first lines."""
    for i in reversed(_editable(messages)):
        m = messages[i]
        lines = m.content.split("\n")
        if m.role == "tool" and len(lines) > TRUNCATE_LINES + 3:
            cut = "\n".join(lines[:TRUNCATE_LINES]) + f"\n... [{len(lines) - TRUNCATE_LINES} more lines truncated]"
            return _one(i, i + 1, [m.model_copy(update={"content": cut})])
    return None


def summary(tok, messages, seed, share: float = 0.12) -> list[Directive] | None:
    """The oldest run of whole messages holding about ``share`` of the tokens, as one summary."""
    sizes = [len(t) for t in tok.encode_messages(messages)]
    want = share * sum(sizes)
    start = next((i for i in _editable(messages) if not messages[i].content.startswith("(summary")), None)
    if start is None:
        return None
    end, got = start, 0
    while end < _editable(messages).stop and (got < want or messages[end].role == "tool"):
        got += sizes[end]
        end += 1
    while end > start and messages[end - 1].role == "assistant" and messages[end - 1].tool_calls:
        end -= 1  # keep a call with its output
    if end - start < 2:
        return None
    tools = sorted({c.function.name for m in messages[start:end] for c in (m.tool_calls or [])})
    text = f"(summary of {end - start} earlier messages: tools used {', '.join(tools) or 'none'}; nothing failed)"
    return _one(start, end, [Message(role="user", content=text)])


def compact(tok, messages, seed) -> list[Directive] | None:
    return summary(tok, messages, seed, share=0.3)


EDITS = {"clear": clear, "drop": drop, "insert": insert, "truncate": truncate, "summary": summary,
         "compact": compact}
