"""The one owner of KV blocks: every block taken from the pool or given back goes through here.

nano-vllm style: the pool (:class:`~.kv_cache.BlockPool`) is storage and a free
list; :class:`BlockManager` decides who holds which block. A sequence's blocks
live in its :class:`~.kv_cache.BlockTable`:

* :meth:`reserve` grows a table to hold a number of positions;
* :meth:`trim` gives back the blocks past what a number of positions needs;
* :meth:`fork` starts a copy-on-write table (a kept prefix of blocks plus fresh
  ones) and :meth:`take` adds fresh blocks to such a transaction;
* :meth:`commit` replaces a table by its successor, giving back the blocks
  only the old one used;
* :meth:`release` gives back blocks (a whole table, or a failed transaction's).

The accounting rule the tests check: the free count plus every live table's
blocks is the pool's size, and a session holds exactly the blocks its tokens need.
"""

from __future__ import annotations

from leyline_runtime.engine.kv_cache import BlockPool, BlockTable


class BlockManager:
    def __init__(self, pool: BlockPool):
        self.pool = pool

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return self.pool.blocks_for(num_tokens)

    def reserve(self, table: BlockTable, num_tokens: int) -> list[int]:
        """Grow ``table`` to hold ``num_tokens`` positions; returns the blocks it added
        (raises CapacityExceeded, taking nothing, when the pool has too few)."""
        extra = self.blocks_for(num_tokens) - len(table.blocks)
        if extra <= 0:
            return []
        added = self.pool.allocate(extra)
        table.blocks.extend(added)
        return added

    def trim(self, table: BlockTable, num_tokens: int) -> None:
        """Give back ``table``'s blocks past the ones ``num_tokens`` positions need."""
        keep = self.blocks_for(num_tokens)
        extra = table.blocks[keep:]
        del table.blocks[keep:]
        self.pool.free(extra)

    def fork(self, table: BlockTable, keep_blocks: int, num_tokens: int) -> tuple[BlockTable, list[int]]:
        """A new table sharing ``table``'s first ``keep_blocks`` blocks and fresh ones up to
        ``num_tokens`` positions; -> (the table, its fresh blocks: the caller's to release on failure)."""
        fresh = self.take(max(0, self.blocks_for(num_tokens) - keep_blocks))
        return BlockTable(table.block_size, table.blocks[:keep_blocks] + fresh), fresh

    def take(self, n: int) -> list[int]:
        """``n`` fresh blocks for a transaction (copy-on-write); release them if it fails."""
        return self.pool.allocate(n)

    def commit(self, old: BlockTable, new: BlockTable) -> None:
        """``new`` replaces ``old``: give back the blocks only ``old`` used."""
        kept = set(new.blocks)
        self.pool.free([b for b in old.blocks if b not in kept])

    def release(self, blocks: BlockTable | list[int]) -> None:
        """Give back a whole table's blocks (emptying it) or a list of blocks."""
        if isinstance(blocks, BlockTable):
            table, blocks = blocks, blocks.blocks
            table.blocks = []
        self.pool.free(blocks)
