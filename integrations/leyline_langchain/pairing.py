"""Keep tool calls and their results paired in a view before it goes to the model.

A *tool unit* is an assistant message with tool calls followed by the tool
messages that answer them. Edits made by hand (``RemoveMessage`` of a failed
attempt, ``trim_messages`` cutting through a unit, a dropped result) can leave

* an **orphan result**: a tool message that answers no call of the assistant
  message opening its run of tool messages — it is dropped;
* an **unanswered call**: a call with no result in its unit, while the
  conversation has already moved on — a placeholder result is added (the way
  ``ClearToolUsesEdit`` clears: the call stays, its output becomes
  ``placeholder``), with an id derived from the call so that repeated repairs
  of the same view produce the same message and diff clean.

A call in the *last* message of the view is pending (its tools have not run
yet) and is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

__all__ = ["DEFAULT_PLACEHOLDER", "OrphanReport", "find_orphans", "placeholder_id", "repair_orphans"]

DEFAULT_PLACEHOLDER = "[cleared]"  # ClearToolUsesEdit's default placeholder


@dataclass
class OrphanReport:
    """Indices of orphan tool results; ``(message index, call id)`` of unanswered calls."""

    orphan_results: list[int] = field(default_factory=list)
    unanswered_calls: list[tuple[int, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.orphan_results or self.unanswered_calls)


def placeholder_id(call_id: str) -> str:
    return f"leyline-placeholder-{call_id}"[:128]


def find_orphans(messages: Sequence[BaseMessage]) -> OrphanReport:
    report = OrphanReport()
    for opener, members in _units(messages):
        if opener is None:
            report.orphan_results.extend(members)
            continue
        ai = messages[opener]
        assert isinstance(ai, AIMessage)
        open_ids = [c.get("id") for c in _calls(ai)]
        answered: set[str] = set()
        for i in members:
            tool_call_id = messages[i].tool_call_id  # type: ignore[attr-defined]
            if tool_call_id in open_ids and tool_call_id not in answered:
                answered.add(tool_call_id)
            else:
                report.orphan_results.append(i)  # answers nothing here, or answers twice
        pending = opener == len(messages) - 1
        if not pending:
            report.unanswered_calls.extend(
                (opener, cid) for cid in open_ids if cid and cid not in answered)
    report.orphan_results.sort()
    return report


def repair_orphans(messages: Sequence[BaseMessage], placeholder: str = DEFAULT_PLACEHOLDER) -> list[BaseMessage]:
    """``messages`` with orphan results dropped and unanswered calls given a placeholder result.

    Returns the input list itself (same object) when nothing needs repair.
    """
    report = find_orphans(messages)
    if not report:
        return messages if isinstance(messages, list) else list(messages)
    drop = set(report.orphan_results)
    missing: dict[int, list[str]] = {}
    for opener, cid in report.unanswered_calls:
        missing.setdefault(opener, []).append(cid)
    out: list[BaseMessage] = []
    units = {opener: members for opener, members in _units(messages) if opener is not None}
    for i, message in enumerate(messages):
        if i not in drop:
            out.append(message)
        # Placeholders go after the last message of the unit (its results, or the call itself).
        for opener, cids in missing.items():
            if i == (units[opener][-1] if units[opener] else opener):
                ai = messages[opener]
                names = {c.get("id"): c.get("name") for c in _calls(ai)}  # type: ignore[arg-type]
                out.extend(ToolMessage(content=placeholder, tool_call_id=cid, name=names.get(cid),
                                       id=placeholder_id(cid)) for cid in cids)
    return out


def _calls(message: AIMessage) -> list[dict]:
    return [dict(c) for c in message.tool_calls] + [
        dict(c) for c in message.invalid_tool_calls if c.get("id") and c.get("name")]


def _units(messages: Sequence[BaseMessage]) -> list[tuple[int | None, list[int]]]:
    """``(opener index, tool message indices)`` per unit; opener ``None`` for stray tool runs."""
    units: list[tuple[int | None, list[int]]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        if isinstance(message, AIMessage) and _calls(message):
            opener: int | None = i
            i += 1
        elif isinstance(message, ToolMessage):
            opener = None
        else:
            i += 1
            continue
        members = []
        while i < len(messages) and isinstance(messages[i], ToolMessage):
            members.append(i)
            i += 1
        units.append((opener, members))
    return units
