"""The blocks a session keeps in vLLM's paged cache between its turns (scheduler side).

When a request that saves a snapshot finishes, :class:`HoldTable` takes one
reference on each of its blocks (``BlockPool.touch``, the route vLLM's
``bind_gpu_block_pool`` names: "inc/dec ref counts"), so vLLM frees the request
but not its blocks: the session's next turn copies and rotates rows block to
block, and vLLM's prefix cache keeps hitting the exact ones. A hold is a
reference, not a copy: the session's rows exist once.

Holds are bounded, oldest (least recently used) released first:

* ``ttl``: idle longer than ``ttl_s`` (a session waiting on a slow tool keeps
  its blocks until then). Checked at every engine step; an idle engine takes no
  steps, and has no use for the blocks either.
* ``pressure``: a request is about to be scheduled and the pool's free blocks
  (free and evictable cached ones) do not cover what it needs, or the running
  requests' next blocks.
* ``budget``: the held blocks passed ``max_fraction`` of the pool.
* ``dropped``: the session released the snapshot (a newer one replaced it, a
  directive's request superseded it, the session was deleted).

A hold that is needed as a load's source is pinned until the load is handed
to the worker, so it is never released under a load in flight. With a host
tier (``spill=True``), a hold released for ttl/pressure/budget first has its
rows copied to host memory by the worker; its blocks go back to the pool once
the worker reports the copy (one engine step later). Without one, the blocks
go back at once and a later load from that snapshot is cut short with the
fallback ``hold_released: <reason>``.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

_FORGOTTEN = 4096  # released keys remembered (for the fallback reason), oldest forgotten first


@dataclass
class Hold:
    key: str
    blocks: list[Any]  # vLLM KVCacheBlocks, one reference each held by this table
    tokens: int  # rows [0, tokens) are valid
    last_used: float
    pins: int = 0

    @property
    def block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


@dataclass
class Spill:
    """A released hold whose rows the worker copies to the host tier before its blocks are freed."""

    key: str
    block_ids: list[int]
    tokens: int


@dataclass
class HoldTable:
    pool: Any  # vLLM's BlockPool
    ttl_s: float
    max_fraction: float
    spill: bool = False  # a host tier exists: released holds are copied there first
    clock: Callable[[], float] = time.monotonic
    releases: Counter = field(default_factory=Counter)  # reason -> holds released (since start)
    _holds: "OrderedDict[str, Hold]" = field(default_factory=OrderedDict)  # least recently used first
    _spilling: dict[str, Hold] = field(default_factory=dict)  # waiting for the worker's host copy
    _spills: list[Spill] = field(default_factory=list)  # to hand to the worker this step
    _released: "OrderedDict[str, str]" = field(default_factory=OrderedDict)  # key -> why
    _freed: list[str] = field(default_factory=list)  # released since the worker was last told
    _held_blocks: int = 0

    def __len__(self) -> int:
        return len(self._holds)

    @property
    def busy(self) -> bool:
        """Anything held, being copied out, or released and not yet handed to the worker."""
        return bool(self._holds or self._spilling or self._spills or self._freed)

    @property
    def held_blocks(self) -> int:
        """Blocks this table keeps from the pool (holds, and released ones still being copied out)."""
        return self._held_blocks

    def hold(self, key: str, blocks: list[Any], tokens: int) -> None:
        self.release(key, "dropped")  # a key is written once; be safe against a repeat
        self.pool.touch(blocks)
        self._holds[key] = Hold(key, list(blocks), tokens, self.clock())
        self._held_blocks += len(blocks)
        self._released.pop(key, None)
        self._enforce_budget()

    def get(self, key: str) -> Hold | None:
        """The live hold of ``key`` (marked used), or None."""
        hold = self._holds.get(key)
        if hold is not None:
            hold.last_used = self.clock()
            self._holds.move_to_end(key)
        return hold

    def spilling(self, key: str) -> bool:
        return key in self._spilling

    def why_released(self, key: str) -> str | None:
        return self._released.get(key)

    def pin(self, key: str) -> None:
        self._holds[key].pins += 1

    def unpin(self, key: str) -> None:
        hold = self._holds.get(key)
        if hold is not None and hold.pins:
            hold.pins -= 1

    def release(self, key: str, reason: str, *, spill: bool | None = None) -> bool:
        """Give ``key``'s blocks back (after a host copy where ``spill``; default: whenever a host tier
        exists and the release is not a drop)."""
        hold = self._holds.pop(key, None)
        if hold is None:
            return False
        self.releases[reason] += 1
        if spill if spill is not None else (self.spill and reason != "dropped"):
            self._spilling[key] = hold
            self._spills.append(Spill(key, hold.block_ids, hold.tokens))
        else:
            self._free(hold)
        self._released[key] = reason
        self._freed.append(key)
        while len(self._released) > _FORGOTTEN:
            self._released.popitem(last=False)
        return True

    def spilled(self, keys) -> None:
        """The worker copied these holds to the host tier: their blocks go back to the pool."""
        for key in keys:
            hold = self._spilling.pop(key, None)
            if hold is not None:
                self._free(hold)

    def _free(self, hold: Hold) -> None:
        self.pool.free_blocks(reversed(hold.blocks))  # the tail is evicted first, as vLLM frees a request
        self._held_blocks -= len(hold.blocks)

    def take_spills(self) -> list[Spill]:
        spills, self._spills = self._spills, []
        return spills

    def take_released(self) -> list[str]:
        freed, self._freed = self._freed, []
        return freed

    def expire(self) -> None:
        """Release holds idle longer than the TTL."""
        deadline = self.clock() - self.ttl_s
        expired = []
        for key, hold in self._holds.items():  # least recently used first: stop at the first fresh one
            if hold.last_used >= deadline:
                break
            if not hold.pins:
                expired.append(key)
        for key in expired:
            self.release(key, "ttl")

    def relieve(self, needed_blocks: int) -> None:
        """Release the oldest unpinned holds until the pool has ``needed_blocks`` free (or none is left)."""
        if self.pool.get_num_free_blocks() >= needed_blocks:  # the common case: nothing to look at
            return
        for key in [k for k, h in self._holds.items() if not h.pins]:
            # blocks being copied to the host tier are free by the next step: count them
            coming = sum(len(h.blocks) for h in self._spilling.values())
            if self.pool.get_num_free_blocks() + coming >= needed_blocks:
                return
            self.release(key, "pressure")

    def _enforce_budget(self) -> None:
        limit = int(self.max_fraction * self.pool.num_gpu_blocks)
        if self._held_blocks <= limit:
            return
        for key in [k for k, h in self._holds.items() if not h.pins]:
            if self.held_blocks <= limit:
                return
            self.release(key, "budget")
