"""The host tier: copies of released holds' rows (host memory, LRU under a byte budget).

A session's rows live in vLLM's paged cache while its hold lasts
(:mod:`leyline_vllm.kv.holds`). When a hold is released for its TTL, the pool's
pressure or the hold budget, and this tier has a budget
(``LEYLINE_VLLM_HOST_TIER_GIB`` > 0), the worker first copies the rows here, so
the session's next turn still loads them instead of recomputing. One
``[tokens, width]`` tensor per attention layer, in the cache's own dtype (a
token's rows as :mod:`leyline_vllm.kv.layout` defines them: MLA's ``c_kv | k_pe``,
or ``K | V`` per KV head). With a budget of 0 (the default) nothing is ever
copied and the tier holds 0 bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class Rows:
    layers: dict[str, torch.Tensor]  # layer name -> [num_tokens, width]
    filled: int = 0  # rows [0, filled) hold saved values

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers.values())


class RowStore:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, Rows] = OrderedDict()
        self._evicted: list[str] = []
        self.nbytes = 0  # kept as entries come and go: the worker reports it every engine step

    def get(self, key: str) -> Rows | None:
        rows = self._entries.get(key)
        if rows is not None:
            self._entries.move_to_end(key)
        return rows

    def create(self, key: str, num_tokens: int, width: int, dtypes: dict[str, torch.dtype]) -> Rows:
        """A fresh entry for ``num_tokens`` rows of ``width`` values per layer (in each layer's dtype)."""
        self.drop([key])
        layers = {name: torch.empty(num_tokens, width, dtype=dtype, device="cpu") for name, dtype in dtypes.items()}
        rows = Rows(layers)
        self._entries[key] = rows
        self.nbytes += rows.nbytes
        self._evict()
        return rows

    def drop(self, keys) -> int:
        dropped = [rows for k in keys if (rows := self._entries.pop(k, None)) is not None]
        self.nbytes -= sum(rows.nbytes for rows in dropped)
        return len(dropped)

    def take_evicted(self) -> list[str]:
        """Keys evicted for the budget since the last call."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def _evict(self) -> None:
        while self.nbytes > self.budget_bytes and len(self._entries) > 1:
            key, rows = self._entries.popitem(last=False)  # least recently used
            self.nbytes -= rows.nbytes
            self._evicted.append(key)
