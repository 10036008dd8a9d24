"""What the connector's two halves tell each other each engine step.

The scheduler side (in vLLM's EngineCore process) hands the worker side
:class:`LeylineMetadata` with the step's scheduler output; the worker answers
with :class:`LeylineWorkerReport` in the step's model-runner output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata

from .holds import Spill
from .wire import RowCopy


@dataclass
class LoadJob:
    req_id: str
    session: str
    copies: list[RowCopy]  # destination positions [start, end) only
    start: int
    end: int
    block_ids: list[int]


@dataclass
class RowsAt:
    """Where a saving request's rows are after this step: rows [0, filled) in ``block_ids``."""

    key: str
    block_ids: list[int]
    filled: int


@dataclass
class LeylineMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    rows: list[RowsAt] = field(default_factory=list)
    spills: list[Spill] = field(default_factory=list)  # copy to the host tier (blocks still held)
    released: list[str] = field(default_factory=list)  # keys whose blocks are no longer held
    host_drops: list[str] = field(default_factory=list)  # keys to forget on the host tier


@dataclass
class LeylineWorkerReport(KVConnectorWorkerMetadata):
    failed: dict[str, str] = field(default_factory=dict)  # req_id -> reason
    spilled: list[str] = field(default_factory=list)  # keys now on the host tier
    evicted: list[str] = field(default_factory=list)  # keys the host tier let go (over its budget)
    host_bytes: int | None = None  # the host tier's size, when it changed

    def aggregate(self, other: "LeylineWorkerReport") -> "LeylineWorkerReport":
        return LeylineWorkerReport({**self.failed, **other.failed}, self.spilled + other.spilled,
                                   self.evicted + other.evicted,
                                   other.host_bytes if other.host_bytes is not None else self.host_bytes)
