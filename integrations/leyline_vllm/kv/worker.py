"""The connector's worker side, in vLLM's worker process: the per-layer rows of the paged cache
(:mod:`leyline_vllm.kv.layout`), where each held snapshot's rows are, and the step's loads and spills.

A load copies rows block to block within the paged cache, from a snapshot's held blocks (or the
host tier) into the blocks vLLM allocated, rotating each row's rope part by its copy's delta with
``leyline_kernels.rotate_and_splice`` (MLA: ``k_pe`` of the ``c_kv | k_pe`` row; standard attention:
the rotary dims of every K head, V copied).

A model whose cache cannot be spliced exactly is still served: registration never fails, it records
why (:attr:`WorkerSide.refusal`, read by the API server through ``leyline_support``) and every load is
refused, so the API server sends no row plans for it. A load that fails anywhere (a host-tier entry
evicted, a fault mid-write) marks every destination block invalid; with
``kv_load_failure_policy="recompute"`` vLLM then recomputes them (an honest prefill) and the request's
finished ``kv_transfer_params`` name the fallback.
"""

from __future__ import annotations

import torch

from vllm.logger import init_logger

from leyline_kernels import delta_rotation_table, rotate_and_splice

from .faults import PROBE_FAULT_ENV, TestFaults
from .holds import Spill
from .host_tier import RowStore
from .layout import LayerRows, SpliceLayout, UnsupportedModel, layer_rows
from .metadata import LeylineMetadata, LeylineWorkerReport, LoadJob
from .rope import model_rotary_embeddings

logger = init_logger(__name__)


class WorkerSide:
    def __init__(self, vllm_config, block_size: int, num_blocks: int, host_tier_bytes: int,
                 faults: TestFaults | None):
        self._vllm_config = vllm_config
        self.block_size = block_size
        self._num_blocks = num_blocks
        self._faults = faults
        self._rows: dict[str, LayerRows] = {}  # layer -> its rows in the paged cache
        self._held: dict[str, tuple[list[int], int]] = {}  # key -> (block ids, rows filled)
        self._store = RowStore(host_tier_bytes)
        self._reported_host_bytes = 0
        self._spilled: list[str] = []
        self._layout: SpliceLayout | None = None
        self.refusal: str | None = None  # why this model's cache is not spliced (None: it is)
        self._failed_blocks: set[int] = set()
        self._failed_reqs: dict[str, str] = {}

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        try:
            if self._faults is not None and self._faults.probe:
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
        logger.info("Leyline connector: %d %s layers, %d row(s) of %d per token, rope %s (%s, %d dims at %d), %s rows",
                    len(self._rows), lay.kind, lay.rows_per_token, lay.row_width, lay.rope.kind,
                    lay.rope.pair_layout, lay.rope.rotary_dim, lay.rope_offset,
                    type(next(iter(self._rows.values()))).__name__)

    def support(self) -> dict:
        """What the API server needs to plan: whether rows are spliced, and the layout or the reason."""
        lay = self._layout
        if lay is None:
            return {"supported": False, "reason": self.refusal or "the KV caches are not registered yet"}
        return {"supported": True, "reason": None, "kind": lay.kind, "rope": lay.rope.kind,
                "pair_layout": lay.rope.pair_layout, "rotary_dim": lay.rope.rotary_dim,
                "rope_offset": lay.rope_offset, "rows_per_token": lay.rows_per_token, "row_width": lay.row_width,
                "layers": len(self._rows), "row_access": type(next(iter(self._rows.values()))).__name__}

    def start_load_kv(self, meta: LeylineMetadata) -> None:
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

    def snapshot_rows(self, key: str) -> list[torch.Tensor] | None:
        """Every layer's rows of snapshot ``key`` (from its held blocks, else the host tier), or None."""
        held = self._held.get(key)
        entry = self._store.get(key) if held is None else None
        if held is None and entry is None:
            return None
        return list(self._source(key, 0, held[1] if held is not None else entry.filled).values())

    def drift(self, old_key: str, old_start: int, new_key: str, new_start: int, count: int) -> list[float] | None:
        """What amortize would have left in ``count`` rows: the rows of ``old_key`` from ``old_start``, rotated
        to ``new_start`` (as a load would move them), against the rows ``new_key`` computed there exactly
        (after the edit, in the edited context). Per layer, the mean over the rows of
        ``|rotated - exact| / |exact|`` (each token's rows as one vector). Layer 0 is exact after a rotation
        (only rounding remains); from layer 1 on it is the edit's drift. None when either snapshot is gone."""
        layout = self._layout
        if layout is None or (old_key not in self._held and self._store.get(old_key) is None) \
                or (new_key not in self._held and self._store.get(new_key) is None):
            return None
        old = self._source(old_key, old_start, count)
        new = self._source(new_key, new_start, count)
        device = next(iter(self._rows.values())).device
        delta_index, cos, sin = delta_rotation_table(torch.full((count,), new_start - old_start), layout.rope.inv_freq,
                                                     device)
        out = []
        for name in self._rows:
            src = old[name].to(device).reshape(-1, layout.row_width)
            rotated = torch.empty_like(src)
            rows = torch.arange(src.shape[0], device=device)
            rotate_and_splice(src, rotated, rows, rows, delta_index.repeat_interleave(layout.rows_per_token), cos, sin,
                              layout.rope_offset, layout.rope.rotary_dim, pair_layout=layout.rope.pair_layout)
            exact = new[name].to(device).float().reshape(count, -1)
            moved = rotated.float().reshape(count, -1)
            change = (moved - exact).norm(dim=-1) / exact.norm(dim=-1).clamp_min(1e-12)
            out.append(float(change.mean()))
        return out

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
        faults = self._faults
        no_rotate = faults is not None and job.session in faults.no_rotate
        dst_pos, deltas, sources = [], [], []
        for c in job.copies:
            sources.append(self._source(c.src_key, c.src_start, c.count))
            dst_pos.extend(range(c.dst_start, c.dst_end))
            deltas.extend([0 if no_rotate else c.delta] * c.count)
        if dst_pos != list(range(job.start, job.end)):
            raise ValueError(f"copies cover {len(dst_pos)} rows, the load needs [{job.start}, {job.end})")
        slots = self._slots(job.block_ids, job.start, job.end)
        device = slots.device
        delta_index, cos, sin = delta_rotation_table(torch.tensor(deltas), layout.rope.inv_freq, device)
        pairing = layout.rope.pair_layout if faults is None else faults.pairing(job.session, layout.rope.pair_layout)
        for i, name in enumerate(self._rows):
            # every source is gathered (a copy) before anything is written: sources and destinations never alias
            staged = torch.cat([source[name].to(device) for source in sources])
            self._rows[name].splice(staged, slots, delta_index, cos, sin, pairing)
            if i == 0 and faults is not None and job.session in faults.fail_after_layer0:
                raise RuntimeError("injected test fault after writing layer 0")
