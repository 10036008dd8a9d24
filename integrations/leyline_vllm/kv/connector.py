"""``LeylineConnector``: Leyline's KV connector, a thin dispatcher by vLLM's role.

vLLM builds the connector twice: in its EngineCore process with the scheduler role and in each
worker process with the worker role. Each instance holds one side: :class:`~.scheduler.SchedulerSide`
(which tokens a request loads, which blocks stay held between a session's turns) or
:class:`~.worker.WorkerSide` (the paged cache's rows: layout probe, loads with rotation, the host
tier). They talk only through vLLM: :class:`~.metadata.LeylineMetadata` with each step's scheduler
output, :class:`~.metadata.LeylineWorkerReport` back with the model runner's output. How requests
opt in: :mod:`leyline_vllm.kv.wire`.

It declares vLLM's hybrid memory allocator support (``SupportsHMA``): without it vLLM turns the
allocator off for any connector, and a hybrid attention/recurrent model (Qwen3-Next's Gated DeltaNet,
Mamba layers) then fails to start at all ("Failed to promote local KV cache specs to one unified type").
With it such a model starts with its KV cache groups, the worker refuses to splice it by name
(:func:`~leyline_vllm.kv.layout.layer_rows`), and its sessions are served as forget. A spliced model has
one group, whose blocks are the ones the scheduler side holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from . import faults
from .metadata import LeylineMetadata, LeylineWorkerReport
from .scheduler import SchedulerSide, host_tier_bytes
from .worker import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class LeylineConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        block_size = vllm_config.cache_config.block_size
        test_faults = faults.from_env()
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = SchedulerSide(block_size, kv_cache_config, test_faults)
        else:
            num_blocks = kv_cache_config.num_blocks if kv_cache_config is not None else 0
            self.worker = WorkerSide(vllm_config, block_size, num_blocks, host_tier_bytes(), test_faults)

    # -- scheduler role ------------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: "KVCacheManager") -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self.scheduler.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        self.scheduler.bind_gpu_block_pool(gpu_block_pool)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        report = connector_output.kv_connector_worker_meta
        if isinstance(report, LeylineWorkerReport):
            self.scheduler.update_connector_output(report)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """vLLM calls this instead of :meth:`request_finished` once the connector declares ``SupportsHMA``.
        Only a spliced model's requests carry row plans, and a spliced model has one KV cache group."""
        return self.scheduler.request_finished(request, block_ids[0])

    # -- worker role ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, LeylineMetadata)
        self.worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # rows stay where vLLM wrote them (held blocks); nothing is copied per layer

    def wait_for_save(self):
        return

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> LeylineWorkerReport | None:
        return self.worker.build_connector_worker_meta()
