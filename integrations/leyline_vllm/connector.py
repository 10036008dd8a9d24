"""``LeylineConnector``: executes Leyline's row plans inside vLLM's paged cache.

A request opts in through ``kv_transfer_params={"leyline": {...}}`` (the
endpoint plugin sets it; see :mod:`leyline_vllm.request_params`):

* ``load``: row copies (:class:`leyline_vllm.plan.RowCopy`) covering the
  prompt's first tokens. The scheduler side claims them as external cache hits
  (``get_num_new_matched_tokens``, cut to whole blocks and at most
  ``prompt - 1`` tokens, after whatever vLLM's own prefix cache already hit);
  the worker side copies the rows into the blocks vLLM allocated, rotating
  each row's rope part by its copy's delta with ``leyline_kernels.rotate_and_splice``
  (MLA: ``k_pe`` of the ``c_kv | k_pe`` row; standard attention: the rotary
  dims of every K head, V copied; see :mod:`leyline_vllm.layout`). vLLM
  prefills everything after them.
* ``save``: the worker copies the request's rows (prompt and generated
  tokens), as they stand after each step, into its
  :class:`leyline_vllm.store.RowStore` under this key.

A model whose cache cannot be spliced exactly (see :mod:`leyline_vllm.rope`
and :mod:`leyline_vllm.layout`) is still served: the worker records why
(:attr:`LeylineConnector.refusal`, read by the endpoint through
``leyline_support``), and the endpoint sends no row plans for it.

A load that fails anywhere (missing snapshot, a fault mid-write) marks every
destination block invalid; with ``kv_load_failure_policy="recompute"`` vLLM
then recomputes them (an honest prefill) and the request's finished
``kv_transfer_params`` name the fallback. Rows of a failed step are never saved.
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
    KVConnectorWorkerMetadata,
)
from vllm.logger import init_logger

from leyline_kernels import delta_rotation_table

from .layout import LayerRows, SpliceLayout, UnsupportedModel, layer_rows
from .rope import model_rotary_embeddings
from .plan import RowCopy, covered, from_wire, truncate
from .request_params import PARAMS_KEY
from .store import RowStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

STORE_GIB_ENV = "LEYLINE_VLLM_STORE_GIB"
# Test hooks (only for the project's own tests): sessions whose loads fail
# after a partial write / are copied without rotation / rotated with the other pairing.
FAULT_ENV = "LEYLINE_VLLM_TEST_FAULT_SESSIONS"
NO_ROTATE_ENV = "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS"
WRONG_PAIRING_ENV = "LEYLINE_VLLM_TEST_WRONG_PAIRING_SESSIONS"
OTHER_PAIRING = {"half_split": "interleaved", "interleaved": "half_split"}


# -- metadata: scheduler -> worker -> scheduler ------------------------------------------------

@dataclass
class LoadJob:
    req_id: str
    session: str
    copies: list[RowCopy]  # destination positions [start, end) only
    start: int
    end: int
    block_ids: list[int]


@dataclass
class SaveJob:
    req_id: str
    key: str
    num_tokens: int  # the entry's size: prompt + at most max_tokens generated
    start: int
    end: int
    block_ids: list[int]


@dataclass
class LeylineMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)


@dataclass
class LeylineWorkerReport(KVConnectorWorkerMetadata):
    failed: dict[str, str] = field(default_factory=dict)  # req_id -> reason

    def aggregate(self, other: "LeylineWorkerReport") -> "LeylineWorkerReport":
        return LeylineWorkerReport({**self.failed, **other.failed})


# -- scheduler-side bookkeeping ----------------------------------------------------------------

@dataclass
class _Tracked:
    session: str
    prompt_len: int
    capacity: int  # prompt + max_tokens: rows the snapshot can hold
    copies: list[RowCopy]
    save_key: str | None
    local_hit: int = 0
    external: int = 0
    load_pending: bool = False
    saved_upto: int = 0
    fallback: str | None = None


def _session_list(env: str) -> set[str]:
    return {s for s in os.environ.get(env, "").split(",") if s}


class LeylineConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        # scheduler side
        self._tracked: dict[str, _Tracked] = {}
        # worker side
        self._rows: dict[str, LayerRows] = {}  # layer -> its rows in the paged cache
        self._store = RowStore(int(float(os.environ.get(STORE_GIB_ENV, "4")) * 2**30))
        self._layout: SpliceLayout | None = None
        self.refusal: str | None = None  # why this model's cache is not spliced (None: it is)
        self._num_blocks = kv_cache_config.num_blocks if kv_cache_config is not None else 0
        self._vllm_config = vllm_config
        self._failed_blocks: set[int] = set()
        self._failed_reqs: dict[str, str] = {}

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        params = (request.kv_transfer_params or {}).get(PARAMS_KEY)
        if not params:
            return 0, False
        prompt_len = len(request.prompt_token_ids or [])
        copies = from_wire(params.get("load") or [])
        tracked = self._tracked.get(request.request_id)
        if tracked is None:
            max_tokens = request.sampling_params.max_tokens if request.sampling_params else 0
            tracked = self._tracked[request.request_id] = _Tracked(
                session=str(params.get("session", "")), prompt_len=prompt_len,
                capacity=prompt_len + (max_tokens or 0), copies=copies, save_key=params.get("save"))
        # whole blocks only, and vLLM must compute at least the last prompt token
        limit = min(covered(copies), prompt_len - 1)
        limit -= limit % self.block_size
        tracked.local_hit = num_computed_tokens
        tracked.external = max(0, limit - num_computed_tokens)
        return tracked.external, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        tracked = self._tracked.get(request.request_id)
        if tracked is not None:
            tracked.external = num_external_tokens
            tracked.load_pending = num_external_tokens > 0

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = LeylineMetadata()
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
                copies = [c for c in _window(tracked.copies, begin, end)]
                meta.loads.append(LoadJob(req_id, tracked.session, copies, begin, end, blocks))
            if tracked.save_key:
                end = min(start + scheduler_output.num_scheduled_tokens.get(req_id, 0), tracked.capacity)
                tracked.saved_upto = min(tracked.saved_upto, start)  # rewound after a failed load
                if end > tracked.saved_upto:
                    meta.saves.append(SaveJob(req_id, tracked.save_key, tracked.capacity,
                                              tracked.saved_upto, end, blocks))
                    tracked.saved_upto = end
        return meta

    def update_connector_output(self, connector_output) -> None:
        report = connector_output.kv_connector_worker_meta
        if isinstance(report, LeylineWorkerReport):
            for req_id, reason in report.failed.items():
                tracked = self._tracked.get(req_id)
                if tracked is not None:
                    tracked.fallback = reason
                    tracked.external = 0
                    tracked.saved_upto = 0  # that step's rows were not saved: save all again

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is None:
            return False, None
        return False, {PARAMS_KEY: {
            "local_hit": tracked.local_hit,
            "loaded": tracked.external,
            "fallback": tracked.fallback,
            "saved": tracked.save_key if tracked.saved_upto >= tracked.prompt_len else None,
            "saved_tokens": tracked.saved_upto,
        }}

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        try:
            self._layout, self._rows = layer_rows(self._vllm_config, kv_caches, model_rotary_embeddings(),
                                                  self._num_blocks)
        except UnsupportedModel as exc:  # still served: every directive becomes forget, with this reason
            self.refusal = str(exc)
            logger.warning("Leyline connector: this model's cache is not spliced (%s); directives run as forget",
                           exc)
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
        for job in meta.loads:
            try:
                self._load(job)
            except Exception as exc:  # any failure: vLLM recomputes these blocks
                first, last = job.start // self.block_size, -(-job.end // self.block_size)
                self._failed_blocks.update(job.block_ids[first:last])
                self._failed_reqs[job.req_id] = f"kv_load_failed: {exc}"
                logger.warning("Leyline load for %s failed, falling back to prefill: %s", job.req_id, exc)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # rows are copied once per step, in wait_for_save

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        assert isinstance(meta, LeylineMetadata)
        for job in meta.saves:
            if job.req_id in self._failed_reqs:
                continue  # this step's rows are not trustworthy; the recompute saves them
            entry = self._store.get(job.key)
            if entry is None or next(iter(entry.layers.values())).shape[0] != job.num_tokens:
                entry = self._store.create(job.key, job.num_tokens, self._layout.token_width,
                                           {name: rows.dtype for name, rows in self._rows.items()})
            slots = self._slots(job.block_ids, job.start, job.end)
            for name, rows in self._rows.items():
                entry.layers[name][job.start:job.end] = rows.gather(slots).cpu()
            entry.filled = max(entry.filled, job.end)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def build_connector_worker_meta(self) -> LeylineWorkerReport | None:
        if not self._failed_reqs:
            return None
        report, self._failed_reqs = LeylineWorkerReport(self._failed_reqs), {}
        return report

    # worker helpers (also used by the worker extension)

    @property
    def store(self) -> RowStore:
        return self._store

    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        blocks = torch.tensor(block_ids, dtype=torch.int64)[pos // self.block_size]
        return (blocks * self.block_size + pos % self.block_size).to(next(iter(self._rows.values())).device)

    def _load(self, job: LoadJob) -> None:
        layout = self._layout
        if layout is None:
            raise LookupError(f"unsupported_runtime: {self.refusal}")
        dst_pos, deltas, sources = [], [], []
        no_rotate = job.session in _session_list(NO_ROTATE_ENV)
        for c in job.copies:
            entry = self._store.get(c.src_key)
            if entry is None or entry.filled < c.src_start + c.count:
                raise LookupError(f"snapshot {c.src_key!r} is gone or incomplete (evicted?)")
            sources.append((entry, c.src_start, c.count))
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
        for i, (name, rows) in enumerate(self._rows.items()):
            staged = torch.cat([entry.layers[name][s:s + n] for entry, s, n in sources]).to(device)
            rows.splice(staged, slots, delta_index, cos, sin, pairing)
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
