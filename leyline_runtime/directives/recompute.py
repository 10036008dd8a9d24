"""Partial recompute: prefill rows ``[start, end)`` again against the cache as it stands.

Rows before ``start`` are read as they are (exact or not); rows from ``end`` on
are not touched. The blocks that hold ``[start, end)`` are copied into fresh
blocks first (copy-on-write) unless the caller already owns them, so the result
is a new block table: the caller commits it by swapping tables, and until then
the old table still holds every old row. The fresh blocks come from the caller
(the executor's transaction, :meth:`~.executor.Transaction.recompute`), which
takes and gives back every block of a directive batch.
"""

from __future__ import annotations

import torch

from leyline_runtime.engine.engine import Engine
from leyline_runtime.engine.kv_cache import BlockTable


def blocks_to_copy(table: BlockTable, num_tokens: int, start: int, end: int, owned: list[int]) -> list[int]:
    """Indices in ``table`` of the blocks that hold rows ``[start, end)`` and are not ``owned`` (blocks
    the caller allocated for this transaction, written in place): each needs a fresh copy first."""
    if not 0 <= start <= end <= min(num_tokens, table.capacity):
        raise ValueError(f"cannot recompute rows [{start}, {end}) of {num_tokens} tokens")
    if start == end:
        return []
    bs, mine = table.block_size, set(owned)
    return [j for j in range(start // bs, -(-end // bs)) if table.blocks[j] not in mine]


def recompute_rows(engine: Engine, table: BlockTable, tokens: list[int], start: int, end: int,
                   copies: dict[int, int]) -> BlockTable:
    """A table equal to ``table`` except that rows ``[start, end)`` are recomputed.

    ``copies``: index in ``table`` -> the fresh block it is copied into first (every index
    :func:`blocks_to_copy` named).
    """
    if start == end:
        return table
    pool, bs = engine.pool, table.block_size
    blocks = list(table.blocks)
    if copies:
        # Whole blocks are copied: the rows of [start, end) among them are overwritten below,
        # the others (before start or from end on, in the same block) must survive.
        slots = torch.arange(bs)
        src = (torch.tensor([blocks[j] for j in copies])[:, None] * bs + slots).flatten()
        dst = (torch.tensor(list(copies.values()))[:, None] * bs + slots).flatten()
        device = pool.rows.device
        pool.rows[:, dst.to(device)] = pool.rows[:, src.to(device)]
        for j, block in copies.items():
            blocks[j] = block
    new_table = BlockTable(bs, blocks)
    engine.prefill(new_table, tokens[start:end], start, logits="none")
    return new_table
