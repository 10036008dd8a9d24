"""Partial recompute: prefill rows ``[start, end)`` again against the cache as it stands.

Rows before ``start`` are read as they are (exact or not); rows from ``end`` on
are not touched. The blocks that hold ``[start, end)`` are copied into fresh
blocks first (copy-on-write) unless the caller already owns them, so the result
is a new block table: the caller commits it by swapping tables, and until then
the old table still holds every old row.
"""

from __future__ import annotations

import torch

from leyline_runtime.engine.engine import Engine
from leyline_runtime.engine.kv_cache import BlockTable


def recompute_rows(engine: Engine, table: BlockTable, tokens: list[int], start: int, end: int,
                   owned: list[int]) -> BlockTable:
    """A table equal to ``table`` except that rows ``[start, end)`` are recomputed.

    ``owned``: blocks the caller allocated for this transaction (written in place);
    blocks this call allocates are appended to it, so the caller can free them all
    if anything later fails.
    """
    if not 0 <= start <= end <= min(len(tokens), table.capacity):
        raise ValueError(f"cannot recompute rows [{start}, {end}) of {len(tokens)} tokens")
    if start == end:
        return table
    pool, bs = engine.pool, table.block_size
    blocks = list(table.blocks)
    mine = set(owned)
    shared = [j for j in range(start // bs, -(-end // bs)) if blocks[j] not in mine]
    fresh = engine.blocks.take(len(shared))
    owned.extend(fresh)
    if shared:
        # Whole blocks are copied: the rows of [start, end) among them are overwritten below,
        # the others (before start or from end on, in the same block) must survive.
        slots = torch.arange(bs)
        src = (torch.tensor([blocks[j] for j in shared])[:, None] * bs + slots).flatten()
        dst = (torch.tensor(fresh)[:, None] * bs + slots).flatten()
        device = pool.rows.device
        pool.rows[:, dst.to(device)] = pool.rows[:, src.to(device)]
        for j, block in zip(shared, fresh):
            blocks[j] = block
    new_table = BlockTable(bs, blocks)
    engine.prefill(new_table, tokens[start:end], start, logits="none")
    return new_table
