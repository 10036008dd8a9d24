"""Turn "the history was X, now it is Y" into directives.

Agent frameworks hand us whole message lists; the runtime wants a patch.
:func:`split_append` aligns the two lists and answers with

* directives that address ``old`` (sorted, non-overlapping message spans),
* the messages to append after applying them.

Appending is not an edit: growing the history costs only the prefill of what
is new, so the appended tail never becomes a directive.

Which messages are the same is :mod:`._alignment`'s (ids, else what they
render; the leftmost of the longest alignments: edits late in the history are
cheaper and an insertion at the very end becomes free appended tail). A match
whose message changed (same id, new content) becomes a one-message replacement
so the runtime can minimise it at token level; the unmatched runs between
matches become one directive each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ._alignment import align
from .errors import InvalidDirective, InvalidSpan, OverlappingSpans
from .policy import EditContext, IntentPolicy, ModePolicy, force_mode
from .protocol import Directive, Intent, Message, Mode, Span

__all__ = ["apply_directives", "diff_messages", "split_append"]

MessageLike = Message | Mapping[str, Any]

def diff_messages(
    old: Sequence[MessageLike],
    new: Sequence[MessageLike],
    *,
    mode: Mode | None = None,
    policy: ModePolicy | None = None,
    intent: Intent | IntentPolicy | None = None,
) -> list[Directive]:
    """The directives for the edits that turn ``old`` into ``new``.

    Messages appended after the last old message are not edits and are not
    returned; use :func:`split_append` when ``new`` may have grown.
    """
    return split_append(old, new, mode=mode, policy=policy, intent=intent)[0]


def split_append(
    old: Sequence[MessageLike],
    new: Sequence[MessageLike],
    *,
    mode: Mode | None = None,
    policy: ModePolicy | None = None,
    intent: Intent | IntentPolicy | None = None,
) -> tuple[list[Directive], list[Message]]:
    """``(directives, tail)`` with ``apply_directives(old, directives) + tail == new``.

    Directives address ``old`` (a batch, like a patch). Their mode comes from
    ``policy`` (called once per directive), or is ``mode`` for all of them,
    ``"amortize"`` when neither is given. Their intent is ``intent`` for all of
    them, or what a policy answers per edit (``intent=edit_intent``: the SDK's
    reading, :func:`~leyline_sdk.policy.edit_intent`); ``"shrink"`` when not given.
    """
    old_messages, new_messages = _as_messages(old), _as_messages(new)
    choose = _resolve_policy(mode, policy)
    pairs = align(old_messages, new_messages)
    hunks = _hunks(old_messages, new_messages, pairs)
    hunks, tail_start = _split_tail(hunks, len(old_messages), len(new_messages))
    hunks = _merge_insertions(hunks)
    directives = [_directive(h, old_messages, new_messages, choose, intent) for h in hunks]
    return directives, new_messages[tail_start:]


def apply_directives(old: Sequence[MessageLike], directives: Sequence[Directive]) -> list[Message]:
    """Apply a batch of message-unit directives that addresses ``old``.

    The reference semantics of a batch: spans address ``old``, must lie inside
    it and must not overlap. An insertion at ``k`` lands after the replacement
    of a span ending at ``k`` and before the replacement of a span starting at
    ``k``.
    """
    result = _as_messages(old)
    ordered = _ordered_batch(directives, len(result))
    for directive in reversed(ordered):  # from the back, so earlier indices stay valid
        # A message span's replacement is a list of messages (Directive validates it).
        replacement = cast(list[Message], directive.replacement)
        result[directive.span.start : directive.span.end] = replacement
    return result


# --- from alignment to directives ------------------------------------------------


@dataclass(frozen=True)
class _Hunk:
    """``old[old_start:old_end]`` becomes ``new[new_start:new_end]``."""

    old_start: int
    old_end: int
    new_start: int
    new_end: int

    @property
    def is_insertion(self) -> bool:
        return self.old_start == self.old_end


def _hunks(
    old: Sequence[Message], new: Sequence[Message], pairs: Sequence[tuple[int, int]]
) -> list[_Hunk]:
    """One hunk per unmatched run, plus one per matched message that changed."""
    hunks: list[_Hunk] = []
    next_i = next_j = 0
    for i, j in pairs:
        if next_i < i or next_j < j:
            hunks.append(_Hunk(next_i, i, next_j, j))
        if old[i] is not new[j] and old[i] != new[j]:  # same id or rendering, yet changed
            hunks.append(_Hunk(i, i + 1, j, j + 1))
        next_i, next_j = i + 1, j + 1
    if next_i < len(old) or next_j < len(new):
        hunks.append(_Hunk(next_i, len(old), next_j, len(new)))
    return hunks


def _split_tail(hunks: list[_Hunk], n_old: int, n_new: int) -> tuple[list[_Hunk], int]:
    """Cut what goes after the last old message off the edits; return where it starts in new.

    A trailing unmatched run that adds more messages than it removes keeps as
    many new messages as it removes (paired in order, so a re-rendered last
    message stays a one-message replacement) and appends the rest.
    """
    if not hunks or hunks[-1].old_end != n_old or hunks[-1].new_end != n_new:
        return hunks, n_new
    last = hunks[-1]
    removed = last.old_end - last.old_start
    added = last.new_end - last.new_start
    if removed >= added:
        return hunks, n_new
    tail_start = last.new_start + removed
    if removed == 0:
        return hunks[:-1], tail_start
    return [
        *hunks[:-1],
        _Hunk(last.old_start, last.old_end, last.new_start, tail_start),
    ], tail_start


def _merge_insertions(hunks: list[_Hunk]) -> list[_Hunk]:
    """Fold each insertion into a replacement it touches.

    An insertion at ``k`` next to a span starting or ending at ``k`` is legal
    but leaves its order to convention; one span says it plainly.
    """
    merged: list[_Hunk] = []
    for hunk in hunks:
        prev = merged[-1] if merged else None
        if prev is not None and _insertion_touches(prev, hunk):
            merged[-1] = _Hunk(prev.old_start, hunk.old_end, prev.new_start, hunk.new_end)
        else:
            merged.append(hunk)
    return merged


def _insertion_touches(first: _Hunk, second: _Hunk) -> bool:
    # Hunks that touch in old are contiguous in new too: no match lies between them.
    return first.old_end == second.old_start and (first.is_insertion or second.is_insertion)


def _directive(
    hunk: _Hunk, old: Sequence[Message], new: Sequence[Message], choose: ModePolicy,
    intent: Intent | IntentPolicy | None,
) -> Directive:
    replacement = list(new[hunk.new_start : hunk.new_end])
    edit = EditContext(
        old_messages=tuple(old[hunk.old_start : hunk.old_end]),
        new_messages=tuple(replacement),
        start=hunk.old_start,
        total_messages=len(old),
    )
    return Directive(
        span=Span(start=hunk.old_start, end=hunk.old_end),
        replacement=replacement,
        mode=choose(edit),
        intent=intent(edit) if callable(intent) else intent or "shrink",
    )


def _resolve_policy(mode: Mode | None, policy: ModePolicy | None) -> ModePolicy:
    if mode is not None and policy is not None:
        raise TypeError("pass either mode= or policy=, not both")
    if policy is not None:
        return policy
    return force_mode(mode or "amortize")


# --- applying ----------------------------------------------------------------------


def _ordered_batch(directives: Sequence[Directive], n_messages: int) -> list[Directive]:
    """The batch sorted by position, after checking it addresses ``n_messages`` cleanly."""
    for directive in directives:
        if directive.span.unit != "message":
            raise InvalidDirective("apply_directives handles message spans only")
        if directive.span.end > n_messages:
            raise InvalidSpan(
                f"span [{directive.span.start}, {directive.span.end}) is outside "
                f"the {n_messages} messages"
            )
    # Insertions sort before a span that starts at the same index: they land before it.
    ordered = sorted(directives, key=lambda d: (d.span.start, d.span.end > d.span.start))
    _check_disjoint(ordered)
    return ordered


def _check_disjoint(ordered: Sequence[Directive]) -> None:
    """Span.overlaps over a sorted batch, in one sweep."""
    reach = 0  # furthest end of the spans seen so far
    last_insertion: int | None = None
    for directive in ordered:
        start, end = directive.span.start, directive.span.end
        if start == end:
            clash = start < reach or last_insertion == start
            last_insertion = start
        else:
            clash = start < reach
            reach = max(reach, end)
        if clash:
            raise OverlappingSpans(f"span [{start}, {end}) overlaps another directive's span")


def _as_messages(messages: Sequence[MessageLike]) -> list[Message]:
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]
