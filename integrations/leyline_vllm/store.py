"""The worker's copies of session KV rows (host memory, LRU under a byte budget).

vLLM's paged cache forgets a request's blocks once it finishes (and on CPUs
without AMX it has no prefix cache at all), so, like LMCache, the connector
keeps its own copy of each session's latest prompt rows: one ``[tokens, width]``
tensor per attention layer, in the cache's own dtype (a token's rows as
:mod:`leyline_vllm.layout` defines them: MLA's ``c_kv | k_pe``, or ``K | V`` per KV head).
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
        self._evict()
        return rows

    def drop(self, keys) -> int:
        return sum(self._entries.pop(k, None) is not None for k in keys)

    def _evict(self) -> None:
        total = sum(r.nbytes for r in self._entries.values())
        while total > self.budget_bytes and len(self._entries) > 1:
            _, rows = self._entries.popitem(last=False)  # least recently used
            total -= rows.nbytes
