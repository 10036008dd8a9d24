"""Which messages of two histories are the same: the alignment :mod:`leyline_sdk.diff` turns into directives.

Two messages *match* when both carry ids and the ids are equal, or (when either lacks an id) when they
render the same (:meth:`Message.fingerprint`). Matching is a longest-common-subsequence problem: the
common prefix is taken first, messages that match nothing on the other side are set aside, the rest goes
through Myers' O((N+M)·D) shortest-edit search, and the matches are then pulled as early as they can go
(among equally long alignments the leftmost: edits late in the history are cheaper).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .protocol import Message

__all__ = ["align"]

# Edits one Myers stretch may spend (time and memory grow with its square).
_MYERS_BUDGET = 256
# Bound on the work spent looking for an earlier match for one matched pair.
_MAX_PULL_WINDOW = 4096


@dataclass(frozen=True)
class _Key:
    """What alignment compares: the id (when there is one) and the rendering."""

    id: str | None
    fingerprint: tuple[Any, ...]

    def matches(self, other: _Key) -> bool:
        if self.id is not None and other.id is not None:
            return self.id == other.id
        return self.fingerprint == other.fingerprint


def align(old: Sequence[Message], new: Sequence[Message]) -> list[tuple[int, int]]:
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
