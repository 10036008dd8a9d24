"""``LeylineConnector``: executes Leyline's row plans inside vLLM's paged cache.

A request opts in through ``kv_transfer_params={"leyline": {...}}`` (the
endpoint plugin sets it; see :mod:`leyline_vllm.request_params`):

* ``load``: row copies (:class:`leyline_vllm.plan.RowCopy`) covering the
  prompt's first tokens, each from an earlier request's snapshot. The scheduler
  side claims them as external cache hits (``get_num_new_matched_tokens``, cut
  to whole blocks and at most ``prompt - 1`` tokens, after whatever vLLM's own
  prefix cache already hit); the worker side copies the rows block to block
  within the paged cache, from the snapshot's held blocks into the blocks vLLM
  allocated, rotating each row's rope part by its copy's delta with
  ``leyline_kernels.rotate_and_splice`` (MLA: ``k_pe`` of the ``c_kv | k_pe``
  row; standard attention: the rotary dims of every K head, V copied; see
  :mod:`leyline_vllm.layout`). vLLM prefills everything after them.
* ``save``: when the request finishes, its blocks stay resident under this key
  (:mod:`leyline_vllm.holds`: a reference on each block, bounded by a TTL, the
  pool's pressure and a budget) until a later request releases the key.
  The rows exist once, in vLLM's own cache; a host tier
  (:class:`leyline_vllm.store.RowStore`, ``LEYLINE_VLLM_HOST_TIER_GIB``, off by
  default) keeps a copy of a hold only once it is released for ttl, pressure or
  budget.
* ``release``: snapshot keys to let go of once this request is done (the ones it
  supersedes).

A load whose snapshot was released (and not kept on the host tier) is cut
before that snapshot's first row; the finished request names it
(``fallback: "hold_released: <reason>"``) and vLLM computes the rest.

A model whose cache cannot be spliced exactly (see :mod:`leyline_vllm.rope`
and :mod:`leyline_vllm.layout`) is still served: the worker records why
(:attr:`LeylineConnector.refusal`, read by the endpoint through
``leyline_support``), and the endpoint sends no row plans for it.

A load that fails anywhere (a host-tier entry evicted, a fault mid-write)
marks every destination block invalid; with ``kv_load_failure_policy="recompute"``
vLLM then recomputes them (an honest prefill) and the request's finished
``kv_transfer_params`` name the fallback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from leyline_kernels import delta_rotation_table

from .layout import LayerRows, SpliceLayout, UnsupportedModel, layer_rows
from .rope import model_rotary_embeddings
from .plan import RowCopy, covered, from_wire, truncate
from .request_params import PARAMS_KEY
from .holds import HoldTable, Spill
from .metadata import LeylineMetadata, LeylineWorkerReport, LoadJob, RowsAt
from .store import RowStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

HOST_TIER_ENV = "LEYLINE_VLLM_HOST_TIER_GIB"  # host memory for released holds (default 0: no host tier)
HOLD_TTL_ENV = "LEYLINE_VLLM_HOLD_TTL_S"  # an idle session's blocks stay this long (default 300)
HOLD_FRACTION_ENV = "LEYLINE_VLLM_HOLD_FRACTION"  # at most this share of the pool is held (default 0.5)
# Test hooks (only for the project's own tests): sessions whose loads fail
# after a partial write / are copied without rotation / rotated with the other pairing /
# whose holds go to the host tier as soon as they are made.
FAULT_ENV = "LEYLINE_VLLM_TEST_FAULT_SESSIONS"
NO_ROTATE_ENV = "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS"
WRONG_PAIRING_ENV = "LEYLINE_VLLM_TEST_WRONG_PAIRING_SESSIONS"
SPILL_ENV = "LEYLINE_VLLM_TEST_SPILL_SESSIONS"
PROBE_FAULT_ENV = "LEYLINE_VLLM_TEST_PROBE_FAULT"  # "1": registration fails as a broken probe would
OTHER_PAIRING = {"half_split": "interleaved", "interleaved": "half_split"}
# a finished request's blocks are held only when it ended normally (an aborted one's output is never used)
_HELD_ENDINGS = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION"}


# -- scheduler-side bookkeeping ----------------------------------------------------------------

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


def _session_list(env: str) -> set[str]:
    return {s for s in os.environ.get(env, "").split(",") if s}


def _host_tier_bytes() -> int:
    return int(float(os.environ.get(HOST_TIER_ENV, "0")) * 2**30)


class LeylineConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        # scheduler side
        self._tracked: dict[str, _Tracked] = {}
        self._holds: HoldTable | None = None  # once vLLM binds its block pool
        self._on_host: set[str] = set()  # released holds the host tier has a copy of
        self._host_drops: list[str] = []
        self._drop_after_spill: set[str] = set()
        self._unheld: list[str] = []
        self._host_bytes = 0
        self._host_loads = 0  # copies served from the host tier (a released hold not recomputed)
        self._block_bytes = 0
        if kv_cache_config is not None and kv_cache_config.num_blocks:
            self._block_bytes = sum(t.size for t in kv_cache_config.kv_cache_tensors) // kv_cache_config.num_blocks
        # worker side
        self._rows: dict[str, LayerRows] = {}  # layer -> its rows in the paged cache
        self._held: dict[str, tuple[list[int], int]] = {}  # key -> (block ids, rows filled)
        self._store = RowStore(_host_tier_bytes())
        self._reported_host_bytes = 0
        self._spilled: list[str] = []
        self._layout: SpliceLayout | None = None
        self.refusal: str | None = None  # why this model's cache is not spliced (None: it is)
        self._num_blocks = kv_cache_config.num_blocks if kv_cache_config is not None else 0
        self._vllm_config = vllm_config
        self._failed_blocks: set[int] = set()
        self._failed_reqs: dict[str, str] = {}

    # ---------------------------------------------------------------- scheduler side

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        self._holds = HoldTable(gpu_block_pool, ttl_s=float(os.environ.get(HOLD_TTL_ENV, "300")),
                                max_fraction=float(os.environ.get(HOLD_FRACTION_ENV, "0.5")),
                                spill=_host_tier_bytes() > 0)

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
        return tracked.external, False

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

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = LeylineMetadata()
        holds = self._holds
        if holds is not None and holds.busy:
            holds.expire()
            holds.relieve(len(scheduler_output.num_scheduled_tokens))  # each running request's next block
            meta.spills = holds.take_spills()
            meta.released = holds.take_released()
        if self._unheld:  # finished without a hold (aborted): the worker forgets where their rows were
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

    def update_connector_output(self, connector_output) -> None:
        report = connector_output.kv_connector_worker_meta
        if not isinstance(report, LeylineWorkerReport):
            return
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
            if tracked.session in _session_list(SPILL_ENV):
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

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        try:
            if os.environ.get(PROBE_FAULT_ENV) == "1":
                raise RuntimeError(f"injected by {PROBE_FAULT_ENV}")
            self._layout, self._rows = layer_rows(self._vllm_config, kv_caches, model_rotary_embeddings(),
                                                  self._num_blocks)
        except Exception as exc:  # never stops the engine: served, every directive applied as forget
            self._layout, self._rows = None, {}
            self.refusal = str(exc) if isinstance(exc, UnsupportedModel) else \
                f"the layout probe failed ({type(exc).__name__}: {exc})"
            if any(cache.is_cuda for cache in kv_caches.values()):
                torch.cuda.empty_cache()  # what the probe took goes back before vLLM's warm-up
            logger.warning("Leyline connector: this model's cache is not spliced (%s); directives run as forget",
                           self.refusal)
            return
        lay = self._layout
        logger.info("Leyline connector: %d %s layers, %d row(s) of %d per token, rope %s (%s, %d dims at %d)",
                    len(self._rows), lay.kind, lay.rows_per_token, lay.row_width, lay.rope.kind,
                    lay.rope.pair_layout, lay.rope.rotary_dim, lay.rope_offset)

    def support(self) -> dict:
        """What the endpoint needs to plan: whether rows are spliced, and the layout or the reason."""
        lay = self._layout
        if lay is None:
            return {"supported": False, "reason": self.refusal or "the KV caches are not registered yet"}
        return {"supported": True, "reason": None, "kind": lay.kind, "rope": lay.rope.kind,
                "pair_layout": lay.rope.pair_layout, "rotary_dim": lay.rope.rotary_dim,
                "rope_offset": lay.rope_offset, "rows_per_token": lay.rows_per_token, "row_width": lay.row_width,
                "layers": len(self._rows)}

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, LeylineMetadata)
        for at in meta.rows:
            self._held[at.key] = (at.block_ids, at.filled)
        for spill in meta.spills:  # the blocks stay held until the scheduler reads this step's report
            if self._layout is not None and self._store.budget_bytes > 0:
                self._spill(spill)
        self._store.drop(meta.host_drops)
        for job in meta.loads:
            try:
                self._load(job)
            except Exception as exc:  # any failure: vLLM recomputes these blocks
                first, last = job.start // self.block_size, -(-job.end // self.block_size)
                self._failed_blocks.update(job.block_ids[first:last])
                self._failed_reqs[job.req_id] = f"kv_load_failed: {exc}"
                logger.warning("Leyline load for %s failed, falling back to prefill: %s", job.req_id, exc)
        for key in meta.released:  # after this step's loads: their blocks may be reused from now on
            self._held.pop(key, None)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # rows stay where vLLM wrote them (held blocks); nothing is copied per layer

    def wait_for_save(self):
        return

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def build_connector_worker_meta(self) -> LeylineWorkerReport | None:
        evicted = self._store.take_evicted()
        host_bytes = self._store.nbytes
        if not (self._failed_reqs or self._spilled or evicted or host_bytes != self._reported_host_bytes):
            return None
        report = LeylineWorkerReport(self._failed_reqs, self._spilled, evicted, host_bytes)
        self._failed_reqs, self._spilled, self._reported_host_bytes = {}, [], host_bytes
        return report

    # worker helpers (also used by the worker extension)

    def snapshot_rows(self, key: str) -> list[torch.Tensor] | None:
        """Every layer's rows of snapshot ``key`` (from its held blocks, else the host tier), or None."""
        held = self._held.get(key)
        entry = self._store.get(key) if held is None else None
        if held is None and entry is None:
            return None
        return list(self._source(key, 0, held[1] if held is not None else entry.filled).values())

    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        blocks = torch.tensor(block_ids, dtype=torch.int64)[pos // self.block_size]
        return (blocks * self.block_size + pos % self.block_size).to(next(iter(self._rows.values())).device)

    def _spill(self, spill: Spill) -> None:
        slots = self._slots(spill.block_ids, 0, spill.tokens)
        entry = self._store.create(spill.key, spill.tokens, self._layout.token_width,
                                   {name: rows.dtype for name, rows in self._rows.items()})
        for name, rows in self._rows.items():
            entry.layers[name].copy_(rows.gather(slots).cpu())
        entry.filled = spill.tokens
        self._spilled.append(spill.key)

    def _source(self, key: str, start: int, count: int) -> dict[str, torch.Tensor]:
        """Rows [start, start + count) of snapshot ``key``, per layer: from its held blocks where it is
        held, else from the host tier."""
        held = self._held.get(key)
        if held is not None:
            if held[1] < start + count:
                raise LookupError(f"snapshot {key!r} holds {held[1]} rows, the copy needs {start + count}")
            slots = self._slots(held[0], start, start + count)
            return {name: rows.gather(slots) for name, rows in self._rows.items()}
        entry = self._store.get(key)
        if entry is None or entry.filled < start + count:
            raise LookupError(f"snapshot {key!r} is neither held nor on the host tier (evicted?)")
        return {name: t[start:start + count] for name, t in entry.layers.items()}

    def _load(self, job: LoadJob) -> None:
        layout = self._layout
        if layout is None:
            raise LookupError(f"unsupported_runtime: {self.refusal}")
        dst_pos, deltas, sources = [], [], []
        no_rotate = job.session in _session_list(NO_ROTATE_ENV)
        for c in job.copies:
            sources.append(self._source(c.src_key, c.src_start, c.count))
            dst_pos.extend(range(c.dst_start, c.dst_end))
            deltas.extend([0 if no_rotate else c.delta] * c.count)
        if dst_pos != list(range(job.start, job.end)):
            raise ValueError(f"copies cover {len(dst_pos)} rows, the load needs [{job.start}, {job.end})")
        slots = self._slots(job.block_ids, job.start, job.end)
        device = slots.device
        delta_index, cos, sin = delta_rotation_table(torch.tensor(deltas), layout.rope.inv_freq, device)
        inject_fault = job.session in _session_list(FAULT_ENV)
        pairing = OTHER_PAIRING[layout.rope.pair_layout] if job.session in _session_list(WRONG_PAIRING_ENV) \
            else layout.rope.pair_layout
        for i, name in enumerate(self._rows):
            # every source is gathered (a copy) before anything is written: sources and destinations never alias
            staged = torch.cat([source[name].to(device) for source in sources])
            self._rows[name].splice(staged, slots, delta_index, cos, sin, pairing)
            if inject_fault and i == 0:
                raise RuntimeError("injected test fault after writing layer 0")


def _window(copies: list[RowCopy], begin: int, end: int) -> list[RowCopy]:
    """The parts of ``copies`` whose destinations fall in ``[begin, end)``."""
    out = []
    for c in truncate(copies, end):
        if c.dst_end <= begin:
            continue
        skip = max(0, begin - c.dst_start)
        out.append(RowCopy(c.src_key, c.src_start + skip, c.dst_start + skip, c.count - skip, c.delta))
    return out
