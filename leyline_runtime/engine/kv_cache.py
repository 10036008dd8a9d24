"""Paged KV cache: one pool of fixed-size blocks, per-sequence block tables.

Who holds which block is :mod:`.block_manager`'s business: nothing else calls
:meth:`BlockPool.allocate` or :meth:`BlockPool.free`.

The pool is a single tensor ``[num_layers, num_blocks * block_size, row_width]``;
a token's row in every layer sits at ``block * block_size + slot``. Flattened
to 2-D it is what the rotate-and-splice kernel reads and writes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from leyline_sdk.errors import CapacityExceeded

from leyline_runtime.model import CacheLayout


class BlockPool:
    def __init__(self, layout: CacheLayout, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.layout = layout
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.rows = torch.zeros(layout.num_layers, num_blocks * block_size, layout.row_width,
                                dtype=dtype, device=device)
        # LIFO free list: recently freed blocks are warm in cache.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lock = threading.Lock()  # sessions allocate from their own threads, the engine while decoding

    @property
    def rows_per_layer(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        with self._lock:
            if n > len(self._free):
                raise CapacityExceeded(
                    f"the KV cache needs {n} more blocks of {self.block_size} tokens but only "
                    f"{len(self._free)} of {self.num_blocks} are free")
            taken = self._free[-n:] if n else []
            del self._free[len(self._free) - n:]
            return taken[::-1]

    def free(self, blocks: list[int]) -> None:
        with self._lock:
            self._free.extend(reversed(blocks))

    def shuffle_free(self, seed: int = 0) -> None:
        """Hand out the free blocks in random order from now on, as a pool after much churn does
        (benches: the blocks a session takes next are not neighbours)."""
        with self._lock:
            order = torch.randperm(len(self._free), generator=torch.Generator().manual_seed(seed)).tolist()
            self._free = [self._free[i] for i in order]

    def flat(self) -> torch.Tensor:
        """``[num_layers * rows_per_layer, row_width]`` view for the kernels."""
        return self.rows.view(-1, self.rows.shape[-1])


@dataclass
class BlockTable:
    """The blocks holding one sequence's rows, in position order."""

    block_size: int
    blocks: list[int] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def rows(self, start: int, end: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """Pool row index of each position in ``[start, end)``."""
        if end > self.capacity:
            raise IndexError(f"positions up to {end} exceed the table's {self.capacity} slots")
        return self.rows_at(torch.arange(start, end, dtype=torch.long)).to(device)

    def rows_at(self, positions: torch.Tensor) -> torch.Tensor:
        """Pool row index of each of ``positions`` (int64, on the CPU, inside the table)."""
        blocks = torch.tensor(self.blocks, dtype=torch.long)
        return blocks[positions // self.block_size] * self.block_size + positions % self.block_size

    def extents(self, end: int) -> list[tuple[int, int]]:
        """Positions ``[0, end)`` as runs of consecutive pool rows: ``(first row, length)`` each."""
        if end > self.capacity:
            raise IndexError(f"positions up to {end} exceed the table's {self.capacity} slots")
        runs: list[tuple[int, int]] = []
        bs = self.block_size
        for i in range(-(-end // bs)):
            n = min(bs, end - i * bs)
            row = self.blocks[i] * bs
            if runs and runs[-1][0] + runs[-1][1] == row:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((row, n))
        return runs

