"""Turn "the history was X, now it is Y" into directives.

Agent frameworks hand us whole message lists; the runtime wants a patch.
:func:`split_append` aligns the two lists and answers with

* directives that address ``old`` (sorted, non-overlapping message spans),
* the messages to append after applying them.

Appending is not an edit: growing the history costs only the prefill of what
is new, so the appended tail never becomes a directive.

Alignment. Two messages *match* when both carry ids and the ids are equal, or
(when either lacks an id) when they render the same (:meth:`Message.fingerprint`).
Matching is a longest-common-subsequence problem: the common prefix is taken
first, messages that match nothing on the other side are set aside, the rest
goes through Myers' O((N+M)·D) shortest-edit search, and the matches are then
pulled as early as they can go. Edits late in the history are
cheaper (both modes only touch what follows the edit) and an insertion at the
very end becomes free appended tail, so among equally long alignments we want
the leftmost. A match whose message changed (same id, new content) becomes a
one-message replacement so the runtime can minimise it at token level; the
unmatched runs between matches become one directive each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .errors import InvalidDirective, InvalidSpan, OverlappingSpans
from .policy import EditContext, ModePolicy, force_mode
from .protocol import Directive, Message, Mode, Span

__all__ = ["apply_directives", "diff_messages", "split_append"]

MessageLike = Message | Mapping[str, Any]

# Edits one Myers stretch may spend (time and memory grow with its square).
_MYERS_BUDGET = 256
# Bound on the work spent looking for an earlier match for one matched pair.
_MAX_PULL_WINDOW = 4096


def diff_messages(
    old: Sequence[MessageLike],
    new: Sequence[MessageLike],
    *,
    mode: Mode | None = None,
    policy: ModePolicy | None = None,
) -> list[Directive]:
    """The directives for the edits that turn ``old`` into ``new``.

    Messages appended after the last old message are not edits and are not
    returned; use :func:`split_append` when ``new`` may have grown.
    """
    return split_append(old, new, mode=mode, policy=policy)[0]


def split_append(
    old: Sequence[MessageLike],
    new: Sequence[MessageLike],
    *,
    mode: Mode | None = None,
    policy: ModePolicy | None = None,
) -> tuple[list[Directive], list[Message]]:
    """``(directives, tail)`` with ``apply_directives(old, directives) + tail == new``.

    Directives address ``old`` (a batch, like a patch). Their mode comes from
    ``policy`` (called once per directive), or is ``mode`` for all of them,
    ``"amortize"`` when neither is given.
    """
    old_messages, new_messages = _as_messages(old), _as_messages(new)
    choose = _resolve_policy(mode, policy)
    pairs = _align(old_messages, new_messages)
    hunks = _hunks(old_messages, new_messages, pairs)
    hunks, tail_start = _split_tail(hunks, len(old_messages), len(new_messages))
    hunks = _merge_insertions(hunks)
    directives = [_directive(h, old_messages, new_messages, choose) for h in hunks]
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


# --- alignment -------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    """What alignment compares: the id (when there is one) and the rendering."""

    id: str | None
    fingerprint: tuple[Any, ...]

    def matches(self, other: _Key) -> bool:
        if self.id is not None and other.id is not None:
            return self.id == other.id
        return self.fingerprint == other.fingerprint


def _align(old: Sequence[Message], new: Sequence[Message]) -> list[tuple[int, int]]:
    """Matched ``(old index, new index)`` pairs, increasing in both, as many as possible."""
    old_keys = [_Key(m.id, m.fingerprint()) for m in old]
    new_keys = [_Key(m.id, m.fingerprint()) for m in new]

    def same(i: int, j: int) -> bool:
        return old_keys[i].matches(new_keys[j])

    def equal(i: int, j: int) -> bool:
        return old[i] is new[j] or old[i] == new[j]

    prefix = 0
    while prefix < min(len(old), len(new)) and same(prefix, prefix):
        prefix += 1
    # A message that matches nothing on the other side is in no common
    # subsequence; leaving such messages out shrinks the search, often a lot.
    old_rest = _could_match(old_keys, new_keys, prefix)
    new_rest = _could_match(new_keys, old_keys, prefix)

    def same_in_rest(a: int, b: int) -> bool:
        return same(old_rest[a], new_rest[b])

    rest = [(old_rest[a], new_rest[b]) for a, b in _lcs(len(old_rest), len(new_rest), same_in_rest)]
    return [(k, k) for k in range(prefix)] + _pull_left(rest, same, equal, start=prefix)


def _could_match(keys: Sequence[_Key], others: Sequence[_Key], start: int) -> list[int]:
    """Indices from ``start`` on whose key may match some key in ``others`` (a superset)."""
    other_ids = {k.id for k in others if k.id is not None}
    other_fingerprints = {k.fingerprint for k in others}
    return [
        i
        for i in range(start, len(keys))
        if keys[i].fingerprint in other_fingerprints or keys[i].id in other_ids
    ]


def _lcs(n: int, m: int, same: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """A longest common subsequence of ``range(n)`` and ``range(m)`` under ``same``.

    Myers' search costs O((N+M)·D) time and O(D²) memory for D edits, so it
    runs in stretches of at most ``_MYERS_BUDGET`` edits: each stretch goes as
    far as that budget reaches and the next starts there. Exact whenever the
    whole diff fits in one stretch; near-minimal (never wrong) beyond.
    """
    pairs: list[tuple[int, int]] = []
    x0 = y0 = 0
    while True:
        stretch, (x, y) = _myers(n - x0, m - y0, _shifted(same, x0, y0), _MYERS_BUDGET)
        pairs.extend((i + x0, j + y0) for i, j in stretch)
        x0, y0 = x0 + x, y0 + y
        if x0 == n and y0 == m:
            return pairs


def _shifted(same: Callable[[int, int], bool], di: int, dj: int) -> Callable[[int, int], bool]:
    def shifted(i: int, j: int) -> bool:
        return same(i + di, j + dj)

    return shifted


def _myers(
    n: int, m: int, same: Callable[[int, int], bool], budget: int
) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """Matches on a shortest edit path from (0, 0) toward (n, m), and where it stops.

    The path reaches (n, m) when at most ``budget`` edits are needed, else it
    stops at the furthest point ``budget`` edits reach. ``v[k]`` is the
    furthest x reached on diagonal ``k = x - y``; ``trace[d]`` keeps diagonals
    ``-d..d`` after step ``d`` to walk the path back.
    """
    max_d = min(n + m, budget)
    offset = max_d + 1
    v = [0] * (2 * max_d + 3)
    trace: list[list[int]] = []
    for d in range(max_d + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # step down: one insertion
            else:
                x = v[offset + k - 1] + 1  # step right: one deletion
            y = x - k
            while x < n and y < m and same(x, y):
                x, y = x + 1, y + 1
            v[offset + k] = x
            if x >= n and y >= m:
                trace.append(v[offset - d : offset + d + 1])
                return _myers_path(trace, n, m), (n, m)
        trace.append(v[offset - d : offset + d + 1])
    end = _furthest_on_grid(trace[-1], max_d, n, m)
    return _myers_path(trace, *end), end


def _furthest_on_grid(last: list[int], d: int, n: int, m: int) -> tuple[int, int]:
    # Points past the grid (a step beyond the last message) only lead off it; skip them.
    ends = [(x, x - k) for k in range(-d, d + 1, 2) for x in [last[k + d]]]
    return max(((x, y) for x, y in ends if 0 <= y and x <= n and y <= m), key=sum)


def _myers_path(trace: list[list[int]], end_x: int, end_y: int) -> list[tuple[int, int]]:
    def furthest(d: int, k: int) -> int:
        return trace[d][k + d]

    pairs: list[tuple[int, int]] = []
    x, y = end_x, end_y
    for d in range(len(trace) - 1, 0, -1):
        k = x - y
        went_down = k == -d or (k != d and furthest(d - 1, k - 1) < furthest(d - 1, k + 1))
        prev_k = k + 1 if went_down else k - 1
        prev_x = furthest(d - 1, prev_k)
        prev_y = prev_x - prev_k
        snake_x = prev_x if went_down else prev_x + 1
        while x > snake_x:
            x, y = x - 1, y - 1
            pairs.append((x, y))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:
        x, y = x - 1, y - 1
        pairs.append((x, y))
    pairs.reverse()
    return pairs


def _pull_left(
    pairs: list[tuple[int, int]],
    same: Callable[[int, int], bool],
    equal: Callable[[int, int], bool],
    start: int,
) -> list[tuple[int, int]]:
    """Move each match to the earliest place that keeps the alignment valid.

    Same number of matches, so still a longest common subsequence; the edits
    between matches slide later, toward the cheap end of the history. An exact
    match only moves to another exact match, so no replacement is added.
    """
    pulled: list[tuple[int, int]] = []
    prev_i = prev_j = start - 1
    for i, j in pairs:
        if (i - prev_i) * (j - prev_j) <= _MAX_PULL_WINDOW:
            good = equal if equal(i, j) else same
            i, j = _earliest_match(prev_i + 1, prev_j + 1, i, j, good)
        pulled.append((i, j))
        prev_i, prev_j = i, j
    return pulled


def _earliest_match(
    lo_i: int, lo_j: int, i: int, j: int, same: Callable[[int, int], bool]
) -> tuple[int, int]:
    for cand_i in range(lo_i, i + 1):
        for cand_j in range(lo_j, j + 1):
            if same(cand_i, cand_j):
                return cand_i, cand_j
    return i, j


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
    hunk: _Hunk, old: Sequence[Message], new: Sequence[Message], choose: ModePolicy
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
