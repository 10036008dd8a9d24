"""The connector's scheduler side, in vLLM's EngineCore process: which prompt tokens a request loads,
which blocks stay held for a session between its turns, and what each engine step tells the worker.

A request opts in through ``kv_transfer_params={"leyline": {...}}`` (:mod:`leyline_vllm.kv.wire`):

* ``load``: row copies covering the prompt's first tokens, each from an earlier request's snapshot.
  They are claimed as external cache hits (:meth:`SchedulerSide.get_num_new_matched_tokens`, cut to
  whole blocks and at most ``prompt - 1`` tokens, after whatever vLLM's own prefix cache already hit),
  loaded synchronously (``load_async=False``: vLLM runs the worker's load before the step's forward,
  Model Runner V1 and V2 alike) and vLLM prefills everything after them.
* ``save``: when the request finishes, its blocks stay resident under this key
  (:mod:`leyline_vllm.kv.holds`: a reference on each block, bounded by a TTL, the pool's pressure and
  a budget) until a later request releases the key. A host tier
  (:mod:`leyline_vllm.kv.host_tier`, ``LEYLINE_VLLM_HOST_TIER_GIB``, off by default) keeps a copy of a
  hold only once it is released for ttl, pressure or budget.
* ``release``: snapshot keys to let go of once this request is done (the ones it supersedes).

A load whose snapshot was released (and not kept on the host tier) is cut before that snapshot's first
row; the finished request names it (``fallback: "hold_released: <reason>"``) and vLLM computes the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .faults import TestFaults
from .holds import HoldTable
from .metadata import LeylineMetadata, LeylineWorkerReport, LoadJob, RowsAt
from .wire import PARAMS_KEY, RowCopy, covered, from_wire, truncate

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

HOST_TIER_ENV = "LEYLINE_VLLM_HOST_TIER_GIB"  # host memory for released holds (default 0: no host tier)
HOLD_TTL_ENV = "LEYLINE_VLLM_HOLD_TTL_S"  # an idle session's blocks stay this long (default 300)
HOLD_FRACTION_ENV = "LEYLINE_VLLM_HOLD_FRACTION"  # at most this share of the pool is held (default 0.5)
# A finished request's blocks are held when it ended normally, or was aborted: vLLM's frontend aborts a
# request that hit a stop string (its detokenizer finds the string, not the engine), and that output is
# used; a request whose client went away is aborted too, and the API server releases its key.
_HELD_ENDINGS = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION", "FINISHED_ABORTED"}


def host_tier_bytes() -> int:
    return int(float(os.environ.get(HOST_TIER_ENV, "0")) * 2**30)


@dataclass
class _Tracked:
    session: str
    prompt_len: int
    copies: list[RowCopy]
    save_key: str | None
    release: list[str]
    pinned: list[str] = field(default_factory=list)  # held sources, until the load is handed over
    local_hit: int = 0
    external: int = 0
    load_pending: bool = False
    fallback: str | None = None


class SchedulerSide:
    def __init__(self, block_size: int, kv_cache_config: "KVCacheConfig | None", faults: TestFaults | None):
        self.block_size = block_size
        self._faults = faults
        self._tracked: dict[str, _Tracked] = {}
        self._holds: HoldTable | None = None  # once vLLM binds its block pool
        self._kv_cache_manager: KVCacheManager | None = None
        self._on_host: set[str] = set()  # released holds the host tier has a copy of
        self._host_drops: list[str] = []
        self._drop_after_spill: set[str] = set()
        self._unheld: list[str] = []
        self._host_bytes = 0
        self._host_loads = 0  # copies served from the host tier (a released hold not recomputed)
        self._block_bytes = 0
        if kv_cache_config is not None and kv_cache_config.num_blocks:
            self._block_bytes = sum(t.size for t in kv_cache_config.kv_cache_tensors) // kv_cache_config.num_blocks

    def bind_kv_cache_manager(self, kv_cache_manager: "KVCacheManager") -> None:
        self._kv_cache_manager = kv_cache_manager

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        self._holds = HoldTable(gpu_block_pool, ttl_s=float(os.environ.get(HOLD_TTL_ENV, "300")),
                                max_fraction=float(os.environ.get(HOLD_FRACTION_ENV, "0.5")),
                                spill=host_tier_bytes() > 0)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        params = (request.kv_transfer_params or {}).get(PARAMS_KEY)
        holds = self._holds
        tracked = self._tracked.get(request.request_id)
        if params and tracked is None:
            tracked = self._tracked[request.request_id] = self._track(request, params)
        if holds is not None and len(holds):  # a request is about to get blocks: make room for all of it
            holds.expire()
            needed = -(-request.num_tokens // self.block_size) + 1
            holds.relieve(needed)
            if tracked is not None and tracked.pinned:
                self._unless_it_fits(tracked, needed)
        if tracked is None:
            return 0, False
        # whole blocks only, and vLLM must compute at least the last prompt token
        limit = min(covered(tracked.copies), tracked.prompt_len - 1)
        limit -= limit % self.block_size
        tracked.local_hit = num_computed_tokens
        tracked.external = max(0, limit - num_computed_tokens)
        return tracked.external, False  # synchronous: the worker writes the rows before this step's forward

    def _track(self, request: "Request", params: dict) -> _Tracked:
        """A Leyline request's state; its copies cut before the first whose snapshot is gone, its
        held sources pinned until the load is handed to the worker."""
        tracked = _Tracked(session=str(params.get("session", "")), prompt_len=len(request.prompt_token_ids or []),
                           copies=[], save_key=params.get("save"), release=list(params.get("release") or []))
        holds = self._holds
        for copy in from_wire(params.get("load") or []):
            key = copy.src_key
            if holds is not None and holds.get(key) is not None:
                holds.pin(key)
                tracked.pinned.append(key)
            elif key in self._on_host:
                self._host_loads += 1
            elif not (holds is not None and holds.spilling(key)):
                why = holds.why_released(key) if holds is not None else None
                tracked.fallback = f"hold_released: {why or 'the snapshot is not held'} ({key})"
                break
            tracked.copies.append(copy)
        return tracked

    def _unless_it_fits(self, tracked: _Tracked, needed: int) -> None:
        """A request that could never get its blocks while its own sources are held (they are pinned, so
        pressure cannot take them) lets them go and computes those rows instead."""
        holds = self._holds
        pinned = sum(len(h.blocks) for k in set(tracked.pinned) if (h := holds.get(k)) is not None)
        if needed <= self._kv_cache_manager.block_pool.num_gpu_blocks - 1 - pinned:
            return
        self._unpin(tracked)
        first = next(i for i, c in enumerate(tracked.copies) if holds.get(c.src_key) is not None)
        for key in {c.src_key for c in tracked.copies[first:]}:
            holds.release(key, "pressure", spill=False)
        tracked.copies = tracked.copies[:first]
        tracked.fallback = "hold_released: pressure (the prompt does not fit beside its own snapshot)"

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        tracked = self._tracked.get(request.request_id)
        if tracked is not None:
            tracked.external = num_external_tokens
            tracked.load_pending = num_external_tokens > 0

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> LeylineMetadata:
        meta = LeylineMetadata()
        holds = self._holds
        if holds is not None and holds.busy:
            holds.expire()
            holds.relieve(len(scheduler_output.num_scheduled_tokens))  # each running request's next block
            meta.spills = holds.take_spills()
            meta.released = holds.take_released()
        # finished without a hold (before their prompt was computed, or failed): the worker forgets their rows
        if self._unheld:
            meta.released += self._unheld
            self._unheld = []
        if self._host_drops:
            meta.host_drops, self._host_drops = self._host_drops, []
        if not self._tracked:  # no request carries Leyline parameters: nothing to look at this step
            return meta
        starts = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, start in starts.items():
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            blocks = list(self._kv_cache_manager.get_block_ids(req_id)[0])
            if tracked.load_pending:
                tracked.load_pending = False
                begin, end = tracked.local_hit, tracked.local_hit + tracked.external
                meta.loads.append(LoadJob(req_id, tracked.session, _window(tracked.copies, begin, end), begin, end,
                                          blocks))
            self._unpin(tracked)  # the load (if any) runs this step, before anything is released
            if tracked.save_key:
                end = start + scheduler_output.num_scheduled_tokens.get(req_id, 0)
                meta.rows.append(RowsAt(tracked.save_key, blocks, end))
        return meta

    def _unpin(self, tracked: _Tracked) -> None:
        if self._holds is not None:
            for key in tracked.pinned:
                self._holds.unpin(key)
        tracked.pinned = []

    def update_connector_output(self, report: LeylineWorkerReport) -> None:
        for req_id, reason in report.failed.items():
            tracked = self._tracked.get(req_id)
            if tracked is not None:
                tracked.fallback = reason
                tracked.external = 0
        if self._holds is not None:
            self._holds.spilled(report.spilled)
        for key in report.spilled:
            if key in self._drop_after_spill:
                self._drop_after_spill.discard(key)
                self._host_drops.append(key)
            else:
                self._on_host.add(key)
        self._on_host.difference_update(report.evicted)
        if report.host_bytes is not None:
            self._host_bytes = report.host_bytes

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is None:  # never scheduled (aborted while waiting): still let go of what it releases
            params = (request.kv_transfer_params or {}).get(PARAMS_KEY) or {}
            for key in params.get("release") or ():
                self._drop(key)
            return False, None
        self._unpin(tracked)
        holds = self._holds
        tokens = request.num_computed_tokens - getattr(request, "num_in_flight_tokens", 0)
        saved = None
        if tracked.save_key and holds is not None and request.status.name in _HELD_ENDINGS \
                and tokens >= tracked.prompt_len:
            blocks = self._kv_cache_manager.get_blocks(request.request_id).blocks[0]
            holds.hold(tracked.save_key, list(blocks[: -(-tokens // self.block_size)]), tokens)
            saved = tracked.save_key
            if self._faults is not None and tracked.session in self._faults.spill_at_once:
                holds.release(saved, "test_spill", spill=True)
        elif tracked.save_key:
            self._unheld.append(tracked.save_key)
        for key in tracked.release:
            self._drop(key)
        return False, {PARAMS_KEY: {
            "local_hit": tracked.local_hit,
            "loaded": tracked.external,
            "fallback": tracked.fallback,
            "saved": saved,
            "saved_tokens": tokens if saved else 0,
            "residency": self._residency(),
        }}

    def _drop(self, key: str) -> None:
        """The session is done with ``key``: its blocks (or its host copy) are let go."""
        holds = self._holds
        if holds is not None:
            if holds.spilling(key):
                self._drop_after_spill.add(key)  # forgotten on the host once the worker reports the copy
            holds.release(key, "dropped", spill=False)
        if key in self._on_host:
            self._on_host.discard(key)
            self._host_drops.append(key)

    def _residency(self) -> dict:
        holds = self._holds
        held = holds.held_blocks if holds is not None else 0
        return {"held_blocks": held, "held_bytes": held * self._block_bytes, "holds": len(holds or ()),
                "host_tier_bytes": self._host_bytes, "host_tier_loads": self._host_loads,
                "releases": dict(holds.releases) if holds is not None else {}}


def _window(copies: list[RowCopy], begin: int, end: int) -> list[RowCopy]:
    """The parts of ``copies`` whose destinations fall in ``[begin, end)``."""
    out = []
    for c in truncate(copies, end):
        if c.dst_end <= begin:
            continue
        skip = max(0, begin - c.dst_start)
        out.append(RowCopy(c.src_key, c.src_start + skip, c.dst_start + skip, c.count - skip, c.delta))
    return out
