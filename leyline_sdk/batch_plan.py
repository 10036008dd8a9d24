"""One batch planner: "the session holds X, the caller now wants Y" -> what to send.

Every caller that keeps a session in step with a whole history — the SDK's
:class:`~leyline_sdk.memory.LeylineMemory`, the bundled runtime's
``/v1/chat/completions`` route and the vLLM service's chat route — plans its
directive batch here, so the same edit produces the same batch everywhere:

* the history diff (:func:`~leyline_sdk.diff.split_append`);
* id-only edits (a replacement that renders exactly like what it replaces)
  are not sent: they cost the runtime nothing to skip, and applying them would
  re-tokenize (or, under ``forget``, recompute) for no change; a caller that
  keeps a local copy applies them to it (:attr:`BatchPlan.local`);
* touching edits inside one tool unit (an assistant tool call and its results)
  become one directive, so a policy sees and decides the unit as a whole;
* the batch is checked as the runtime checks it (spans inside the history,
  none overlapping);
* above :data:`~leyline_sdk.protocol.MAX_DIRECTIVES` the plan says
  :attr:`~BatchPlan.rebuild`: build the session afresh from the new history.

Pure pydantic; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .diff import MessageLike, apply_directives, split_append
from .policy import EditContext, ModePolicy, force_mode
from .protocol import MAX_DIRECTIVES, Directive, Intent, Message, Mode, Span

__all__ = ["BatchPlan", "plan_batch"]


@dataclass(frozen=True)
class BatchPlan:
    """What to do to bring a session holding ``old`` to ``new``.

    ``directives``: the batch to send (addresses ``old``; empty when nothing
    renders differently). ``local``: id-only edits, not sent; apply them to a
    local copy of the session. ``tail``: the messages to append after the batch.
    ``rebuild``: the edit needs more than ``MAX_DIRECTIVES`` directives; build
    the session from the new history instead (``directives``, ``local`` and
    ``tail`` are then empty).
    """

    directives: list[Directive] = field(default_factory=list)
    local: list[Directive] = field(default_factory=list)
    tail: list[Message] = field(default_factory=list)
    rebuild: bool = False


def plan_batch(
    old: Sequence[MessageLike],
    new: Sequence[MessageLike],
    *,
    mode: Mode | None = None,
    policy: ModePolicy | None = None,
    max_directives: int = MAX_DIRECTIVES,
) -> BatchPlan:
    """Plan the directive batch that turns ``old`` into ``new`` (see the module docstring).

    Modes come from ``policy`` (once per directive, and once more per merged
    tool unit) or are ``mode`` for all, ``"amortize"`` when neither is given.
    """
    if mode is not None and policy is not None:
        raise TypeError("pass either mode= or policy=, not both")
    choose = policy if policy is not None else force_mode(mode or "amortize")
    old_messages = [m if isinstance(m, Message) else Message.model_validate(m) for m in old]
    diffed, tail = split_append(old_messages, new, policy=choose)
    send: list[Directive] = []
    local: list[Directive] = []
    for d in diffed:
        before = [m.fingerprint() for m in old_messages[d.span.start:d.span.end]]
        after = [m.fingerprint() for m in d.replacement]  # type: ignore[union-attr]
        (local if before == after else send).append(d)
    send = _merge_units(old_messages, send, choose)
    if len(send) > max_directives:
        return BatchPlan(rebuild=True)
    apply_directives(old_messages, [*send, *local])  # spans inside the history, none overlapping (raises if not)
    return BatchPlan(send, local, tail)


def _merge_units(old: list[Message], directives: list[Directive], choose: ModePolicy) -> list[Directive]:
    """Edit a tool call and its results as a unit: merge directives that touch inside one."""
    merged: list[Directive] = []
    for d in sorted(directives, key=lambda d: (d.span.start, d.span.end)):
        prev = merged[-1] if merged else None
        if (prev is not None and prev.span.end == d.span.start
                and prev.span.end > prev.span.start and d.span.end > d.span.start
                and _unit(old, prev.span.end - 1) is not None
                and _unit(old, prev.span.end - 1) == _unit(old, d.span.start)):
            replacement = [*prev.replacement, *d.replacement]
            edit = EditContext(old_messages=tuple(old[prev.span.start:d.span.end]),
                               new_messages=tuple(replacement), start=prev.span.start,
                               total_messages=len(old))
            intent: Intent = "erase" if "erase" in (prev.intent, d.intent) else "shrink"  # an erase stays one
            merged[-1] = Directive(span=Span(start=prev.span.start, end=d.span.end),
                                   replacement=replacement, mode=choose(edit), intent=intent)
        else:
            merged.append(d)
    return merged


def _unit(messages: Sequence[Message], i: int) -> int | None:
    """Index of the assistant message whose tool unit holds message ``i`` (or ``None``)."""
    m = messages[i]
    if m.role == "assistant" and m.tool_calls:
        return i
    if m.role != "tool":
        return None
    j = i
    while j > 0 and messages[j].role == "tool":
        j -= 1
    opener = messages[j]
    return j if opener.role == "assistant" and opener.tool_calls else None
