"""Agent histories of an exact token length, and the edits the edit bench applies to them."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from leyline_sdk.protocol import Directive, Message, Span

from leyline_runtime.text.tokenizer import ChatTokenizer
from . import agent_text
from .exact import grow

PLACEHOLDER = "[cleared]"  # LangChain ClearToolUsesEdit's default placeholder


def history_of_length(tok: ChatTokenizer, n_tokens: int, start_seed: int = 0) -> list[Message]:
    """System prompt + consecutive transcripts, cut and padded to exactly ``n_tokens`` tokens."""
    messages = [agent_text.system()]
    total = len(tok.encode_message(messages[0]))
    if total > n_tokens:
        raise ValueError(f"{n_tokens} tokens cannot hold the {total}-token system prompt")
    seed = start_seed
    while True:
        for m in agent_text.conversation(seed):
            size = len(tok.encode_message(m))
            if total + size > n_tokens:
                messages[-1] = grow(tok, messages[-1], n_tokens - total)
                return messages
            messages.append(m)
            total += size
        seed += 1


def offsets(tok: ChatTokenizer, messages: list[Message]) -> list[int]:
    return [0, *accumulate(map(len, tok.encode_messages(messages)))]


@dataclass
class EditSpec:
    position: float  # fraction of the context where the edit starts
    span: str  # "message" (one tool output cleared), "10pct" (a run of rounds summarised) or "10pct-delete"
    directive: Directive
    start_token: int
    span_tokens: int


def _pick(messages: list[Message], off: list[int], token: int, ok) -> int | None:
    """The first message at/after ``token`` that passes ``ok``, else the last one before it."""
    after = [i for i in range(2, len(messages)) if off[i] >= token and ok(i)]
    before = [i for i in range(2, len(messages)) if off[i] < token and ok(i)]
    return after[0] if after else (before[-1] if before else None)


def _cleared(message: Message) -> Message:
    return message.model_copy(update={"content": PLACEHOLDER})


def make_edit(tok: ChatTokenizer, messages: list[Message], position: float, span: str) -> EditSpec:
    """The directive for one (position, span) cell; raises ValueError if the history has no such edit."""
    off = offsets(tok, messages)
    token = int(position * off[-1])
    if span == "message":
        # a tool output longer than the placeholder, so the edit never grows the history
        def shrinks(i):
            m = messages[i]
            return m.role == "tool" and len(tok.encode_message(_cleared(m))) < off[i + 1] - off[i]

        i = _pick(messages, off, token, shrinks)
        if i is None:
            raise ValueError("no tool output to clear")
        directive = Directive(span=Span(start=i, end=i + 1), replacement=[_cleared(messages[i])])
        return EditSpec(position, span, directive, off[i], off[i + 1] - off[i])
    if span not in ("10pct", "10pct-delete"):
        raise ValueError(f"unknown span {span!r}")
    want = max(1, off[-1] // 10)
    i = _pick(messages, off, token, lambda k: messages[k].role == "assistant" and off[-1] - off[k] >= want)
    if i is None:
        raise ValueError("no assistant message to start a span")
    j = next((j for j in range(i + 1, len(messages) + 1) if off[j] - off[i] >= want), len(messages))
    summary = Message(role="user", content=f"(summary: {j - i} earlier messages elided; nothing failed)")
    replacement = [] if span == "10pct-delete" else [summary]
    return EditSpec(position, span, Directive(span=Span(start=i, end=j), replacement=replacement),
                    off[i], off[j] - off[i])
