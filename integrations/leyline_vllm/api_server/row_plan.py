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

Where an edit's following tokens land is what its directive declared (:class:`Run`, from the chat
template's message bounds: :mod:`.edits`), never re-found by comparing token ids: two edits with the
same text, or an edge that tokenizes like its neighbour, cannot be mistaken for one another. The
tokens are only checked against the snapshot's, which ends where vLLM's reply did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from leyline_runtime.outcome_rule import NO_SAVED_ROWS, ONE_RUN_PER_BATCH, SHORT_RUN, reason

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


@dataclass(frozen=True)
class Run:
    """Where the old history's tokens after one edit, up to the next edit, land in the edited history:
    old ``[src, src + count)`` to ``[dst, dst + count)``."""

    src: int
    dst: int
    count: int


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
    # the first tokens of the moved run, computed exactly instead of rotated (mode auto's signal and
    # repair window): where their old rows were and where they go, for comparing the two
    window: RowCopy | None = None
    run: int | None = None  # which of the runs asked for is moved (rotated, or measured by its window)
    unmoved: dict[int, str] = field(default_factory=dict)  # the runs asked for that are computed: why

    @property
    def rotated_tokens(self) -> int:
        return self.rotated.count if self.rotated else 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_turn(snapshot: Snapshot | None, prompt: list[int], *, min_rotated: int,
              runs: Sequence[Run | None] = (), window: int = 0, keep: int | None = None) -> TurnPlan:
    """Plan ``prompt`` against ``snapshot``.

    Always keeps the common prefix (exact). ``runs`` (amortize): per edit of the batch, where the old
    history's tokens after it land (:class:`Run`, from the directives' own spans; None: nothing of its
    own to move). The longest of them the snapshot holds (at least ``min_rotated`` tokens, e.g. one
    cache block) is moved with its ``k_pe`` rotated; what lies between the prefix and it is prefilled
    first, what follows it computed. Without runs (forget, append) everything after the prefix is
    computed. Each run not moved is named in :attr:`TurnPlan.unmoved` with its reason.

    ``window``: the moved run's first ``window`` tokens are computed exactly (in the edited context,
    right after the replacement) instead of rotated; the rest of the run is rotated if it is still long
    enough. ``keep``: keep at most this many prefix tokens (what follows is recomputed: a drift repair).
    """
    candidates = {k: r for k, r in enumerate(runs) if r is not None and r.count}
    if snapshot is None or not snapshot.token_ids:
        return TurnPlan(prefix=0, unmoved={k: NO_SAVED_ROWS for k in candidates})
    old = snapshot.token_ids
    prefix = common_prefix(old, prompt) if keep is None else min(keep, common_prefix(old, prompt))
    first = [RowCopy(snapshot.key, 0, 0, prefix)] if prefix else []
    held = {k: _held(old, prompt, prefix, r) for k, r in candidates.items()}
    unmoved = {k: reason(SHORT_RUN, f"{r.count} tokens to move, fewer than {min_rotated}")
               for k, r in held.items() if r.count < min_rotated}
    movable = [k for k in held if k not in unmoved]
    if not movable:
        return TurnPlan(prefix=prefix, first=first, unmoved=unmoved)
    chosen = max(movable, key=lambda k: held[k].count)  # the first of the longest
    unmoved.update({k: ONE_RUN_PER_BATCH for k in movable if k != chosen})
    run = held[chosen]
    delta = run.dst - run.src
    exact = RowCopy(snapshot.key, run.src, run.dst, min(window, run.count), delta) if window else None
    w = exact.count if exact else 0
    if run.count - w < min_rotated:
        unmoved[chosen] = reason(SHORT_RUN, f"{run.count - w} tokens after the signal window, fewer than {min_rotated}")
        return TurnPlan(prefix=prefix, first=first, prefill_upto=run.dst + w, window=exact, run=chosen,
                        unmoved=unmoved)
    return TurnPlan(prefix=prefix, first=first, prefill_upto=run.dst + w, window=exact, run=chosen,
                    rotated=RowCopy(snapshot.key, run.src + w, run.dst + w, run.count - w, delta),
                    unmoved=unmoved)


def _held(old: list[int], new: list[int], prefix: int, run: Run) -> Run:
    """The part of ``run`` that lands after the kept prefix and whose tokens the snapshot holds as the
    prompt has them (a snapshot ends with the reply vLLM generated, which the history may render
    differently; the prefix may reach into the replacement where it starts like the old text)."""
    skip = max(0, prefix - run.dst)
    src, dst = run.src + skip, run.dst + skip
    n = 0
    while n < run.count - skip and src + n < len(old) and dst + n < len(new) and old[src + n] == new[dst + n]:
        n += 1
    return Run(src, dst, n)
