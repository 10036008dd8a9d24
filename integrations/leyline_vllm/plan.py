"""Which KV rows a prompt can take from a session's saved rows, and how.

Pure bookkeeping on token ids (no torch, no vLLM): the endpoint plans, the
connector carries the plan to the worker, the worker moves the rows.

A session's rows live in *snapshots*: the KV of one prompt's tokens, saved by
the worker after vLLM computed (or loaded) them. A :class:`RowCopy` moves a
run of snapshot rows to new positions (``delta = dst - src``; the worker
rotates ``k_pe`` by ``delta``). A plan's copies cover the prompt's first
tokens without a gap, because vLLM computes every token after the last loaded
one; tokens in the middle that must be computed (an edit's replacement) are
prefilled by a first request that ends where they end (:class:`TurnPlan`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from difflib import SequenceMatcher


@dataclass(frozen=True)
class RowCopy:
    src_key: str
    src_start: int
    dst_start: int
    count: int

    delta: int = 0

    @property
    def dst_end(self) -> int:
        return self.dst_start + self.count


@dataclass
class Snapshot:
    """What the worker holds under ``key``: the rows of ``token_ids``; the first ``exact`` of them were
    computed honestly in this very context (after a rotation, the moved rows and everything computed
    after them are approximate). ``None``: all of them."""

    key: str
    token_ids: list[int]
    exact: int | None = None

    @property
    def exact_tokens(self) -> int:
        return len(self.token_ids) if self.exact is None else min(self.exact, len(self.token_ids))


@dataclass
class TurnPlan:
    """How one prompt is served from a session's snapshot.

    ``prefill_upto > 0``: a first request computes ``prompt[:prefill_upto]``
    (loading ``first`` = the unchanged prefix) and saves it; the prompt then
    loads those rows plus the rotated ``rotated`` copy.
    """

    prefix: int  # tokens kept as they are (common prefix with the snapshot)
    first: list[RowCopy] = field(default_factory=list)
    prefill_upto: int = 0
    rotated: RowCopy | None = None
    reason: str | None = None  # why no rotation was planned where one was asked for

    @property
    def rotated_tokens(self) -> int:
        return self.rotated.count if self.rotated else 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_turn(snapshot: Snapshot | None, prompt: list[int], *, rotate: bool, min_rotated: int,
              moved: tuple[int, int] | None = None) -> TurnPlan:
    """Plan ``prompt`` against ``snapshot``.

    Always keeps the common prefix (exact). With ``rotate`` (amortize), the
    longest run of snapshot tokens that reappears later in the prompt (at
    least ``min_rotated`` tokens, e.g. one cache block) is moved there with its
    ``k_pe`` rotated; what lies between the prefix and that run is prefilled
    first. Without ``rotate`` (forget) everything after the prefix is computed.

    ``moved`` = (old position, new position) of the first token after an edit,
    where the caller knows it (one directive): the run that starts there is
    taken if it is long enough, without searching the whole prompt (a
    sequence match over a 2k-token history costs milliseconds).
    """
    if snapshot is None or not snapshot.token_ids:
        return TurnPlan(prefix=0)
    old = snapshot.token_ids
    prefix = common_prefix(old, prompt)
    first = [RowCopy(snapshot.key, 0, 0, prefix)] if prefix else []
    if not rotate:
        return TurnPlan(prefix=prefix, first=first)
    run = _run_at(old, prompt, prefix, *moved) if moved is not None else None
    if run is None or run.count < min_rotated:
        run = _longest_moved_run(old, prompt, prefix)
    if run is None or run.count < min_rotated:
        why = "nothing after the edit is long enough to rotate" if prefix < len(old) else None
        return TurnPlan(prefix=prefix, first=first, reason=why)
    return TurnPlan(prefix=prefix, first=first, prefill_upto=run.dst_start,
                    rotated=RowCopy(snapshot.key, run.src_start, run.dst_start, run.count, run.dst_start - run.src_start))


def _run_at(old: list[int], new: list[int], prefix: int, src: int, dst: int) -> RowCopy | None:
    """The run of equal tokens from ``old[src]`` and ``new[dst]`` on (both after the common prefix)."""
    if src < prefix or dst < prefix:
        return None
    n = 0
    while src + n < len(old) and dst + n < len(new) and old[src + n] == new[dst + n]:
        n += 1
    return RowCopy("", src, dst, n) if n else None


def _longest_moved_run(old: list[int], new: list[int], prefix: int) -> RowCopy | None:
    """The longest common run of ``old[prefix:]`` and ``new[prefix:]`` (it sits after the
    first difference, so its rows were computed in another context: amortize's approximation)."""
    matcher = SequenceMatcher(None, old[prefix:], new[prefix:], autojunk=False)
    best = None
    for a, b, size in matcher.get_matching_blocks():
        if size and (best is None or size > best.count):
            best = RowCopy("", prefix + a, prefix + b, size)
    return best


def truncate(copies: list[RowCopy], limit: int) -> list[RowCopy]:
    """The copies cut to destination positions ``[0, limit)``."""
    out = []
    for c in copies:
        if c.dst_start >= limit:
            break
        count = min(c.count, limit - c.dst_start)
        out.append(RowCopy(c.src_key, c.src_start, c.dst_start, count, c.delta))
    return out


def covered(copies: list[RowCopy]) -> int:
    """Destination tokens covered from position 0 without a gap."""
    end = 0
    for c in copies:
        if c.dst_start != end:
            break
        end = c.dst_end
    return end


def to_wire(copies: list[RowCopy]) -> list[dict]:
    return [asdict(c) for c in copies]


def from_wire(items: list[dict]) -> list[RowCopy]:
    return [RowCopy(**item) for item in items]
