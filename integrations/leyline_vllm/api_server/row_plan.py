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

from dataclasses import dataclass, field
from difflib import SequenceMatcher

from ..kv.wire import RowCopy


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
    # the first tokens of the moved run, computed exactly instead of rotated (mode auto's signal and
    # repair window): where their old rows were and where they go, for comparing the two
    window: RowCopy | None = None

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
              moved: tuple[int, int] | None = None, window: int = 0, keep: int | None = None) -> TurnPlan:
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

    ``window``: the moved run's first ``window`` tokens are computed exactly (in the edited context,
    right after the replacement) instead of rotated; the rest of the run is rotated if it is still long
    enough. ``keep``: keep at most this many prefix tokens (what follows is recomputed: a drift repair).
    """
    if snapshot is None or not snapshot.token_ids:
        return TurnPlan(prefix=0)
    old = snapshot.token_ids
    prefix = common_prefix(old, prompt) if keep is None else min(keep, common_prefix(old, prompt))
    first = [RowCopy(snapshot.key, 0, 0, prefix)] if prefix else []
    if not rotate:
        return TurnPlan(prefix=prefix, first=first)
    run = _run_at(old, prompt, prefix, *moved) if moved is not None else None
    if run is None or run.count < min_rotated:
        run = _longest_moved_run(old, prompt, prefix)
    if run is None or run.count < min_rotated:
        why = "nothing after the edit is long enough to rotate" if prefix < len(old) else None
        return TurnPlan(prefix=prefix, first=first, reason=why)
    delta = run.dst_start - run.src_start
    exact = RowCopy(snapshot.key, run.src_start, run.dst_start, min(window, run.count), delta) if window else None
    w = exact.count if exact else 0
    if run.count - w < min_rotated:
        return TurnPlan(prefix=prefix, first=first, prefill_upto=run.dst_start + w, window=exact,
                        reason="nothing after the window is long enough to rotate")
    return TurnPlan(prefix=prefix, first=first, prefill_upto=run.dst_start + w, window=exact,
                    rotated=RowCopy(snapshot.key, run.src_start + w, run.dst_start + w, run.count - w, delta))


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
