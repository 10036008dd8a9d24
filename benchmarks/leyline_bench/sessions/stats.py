"""Sizes of the shipped sessions: ``python -m leyline_bench.sessions.stats`` prints them as Markdown.

Text is measured in characters: every message's content plus each tool call's ``arguments``
JSON, i.e. what the chat carries. The bench has no tokenizer of the model that ran these
sessions (Gemini 3 Pro) offline, so tokens are given two ways: characters / 4, a
model-free estimate, and the prompt tokens the provider itself counted for each session's
last model call (recorded in the source trajectory). *chars per provider token* divides
that last prompt's characters by that count, which says how far characters / 4 is off.
Percentiles are nearest-rank over sessions. PROVENANCE.md carries this output verbatim
(a test checks that it still matches the file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from leyline_sdk.protocol import Message

from .load import Session, load_sessions
from .split import SPLITS

CHARS_PER_TOKEN_ESTIMATE = 4
ELISION_MARK = "<elided_chars>"


def message_chars(message: Message) -> int:
    return len(message.content) + sum(len(c.function.arguments) for c in message.tool_calls or [])


@dataclass(frozen=True)
class SessionSize:
    messages: int
    chars: int
    tool_outputs: int
    tool_output_chars: int
    elided_tool_outputs: int
    format_errors: int  # user messages after the task: mini-swe-agent's answers to a turn it could not run
    last_prompt_chars: int
    last_call_prompt_tokens: int | None

    @classmethod
    def of(cls, session: Session) -> SessionSize:
        messages = session.messages
        tools = [m for m in messages if m.role == "tool"]
        last_assistant = max(i for i, m in enumerate(messages) if m.role == "assistant")
        return cls(
            messages=len(messages), chars=sum(map(message_chars, messages)), tool_outputs=len(tools),
            tool_output_chars=sum(len(m.content) for m in tools),
            elided_tool_outputs=sum(ELISION_MARK in m.content for m in tools),
            format_errors=sum(m.role == "user" for m in messages) - 1,
            last_prompt_chars=sum(map(message_chars, messages[:last_assistant])),
            last_call_prompt_tokens=session.last_call_prompt_tokens)


def nearest_rank(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[round(share * (len(ordered) - 1))]


MEASURES: list[tuple[str, Callable[[SessionSize], float | None], str]] = [
    ("messages", lambda s: s.messages, "{:.0f}"),
    ("characters", lambda s: s.chars, "{:,.0f}"),
    ("tokens, characters / 4", lambda s: s.chars / CHARS_PER_TOKEN_ESTIMATE, "{:,.0f}"),
    ("tokens of the last call's prompt, provider's count", lambda s: s.last_call_prompt_tokens, "{:,.0f}"),
    ("chars per provider token (last prompt)",
     lambda s: s.last_prompt_chars / s.last_call_prompt_tokens if s.last_call_prompt_tokens else None, "{:.2f}"),
    ("tool outputs", lambda s: s.tool_outputs, "{:.0f}"),
    ("characters per tool output (session mean)",
     lambda s: s.tool_output_chars / s.tool_outputs if s.tool_outputs else None, "{:,.0f}"),
    ("share of the text held by tool outputs", lambda s: s.tool_output_chars / s.chars, "{:.0%}"),
    ("elided tool outputs (>= 10k chars)", lambda s: s.elided_tool_outputs, "{:.0f}"),
    ("format-error turns", lambda s: s.format_errors, "{:.0f}"),
]


def render(split: str, sizes: list[SessionSize]) -> str:
    total_chars = sum(s.chars for s in sizes)
    tool_chars = sum(s.tool_output_chars for s in sizes)
    headline = (f"{split}: {len(sizes)} sessions, {sum(s.messages for s in sizes):,} messages, "
                f"{total_chars:,} characters, {sum(s.tool_outputs for s in sizes):,} tool outputs holding "
                f"{tool_chars / total_chars:.0%} of all characters")
    lines = [headline, "",
             "| per session | p10 | median | p90 | max |", "|---|---:|---:|---:|---:|"]
    for name, measure, fmt in MEASURES:
        values = [v for v in map(measure, sizes) if v is not None]
        cells = [fmt.format(nearest_rank(values, q)) for q in (0.1, 0.5, 0.9)] + [fmt.format(max(values))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report() -> str:
    return "\n\n".join(render(split, [SessionSize.of(s) for s in load_sessions(split)]) for split in SPLITS)


if __name__ == "__main__":
    print(report())
