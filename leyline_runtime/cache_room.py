"""Room in the paged cache for sessions: with the directive executor, the one caller of the block manager.

nano-vllm's scheduler is the single caller of its block manager. Here a directive batch's blocks
are its transaction's (:meth:`.directives.executor.DirectiveExecutor.execute`: fork, copy on write,
commit, give back on failure) and a decoding sequence's next block is the engine's; every other
block a session or a piece of scratch work takes or gives back goes through :class:`CacheRoom`.
A session's table grows to hold more positions (when the pool is short, idle sessions are evicted,
least recently used first, within the tenants' shares: :mod:`.sessions.tenancy`), gives back the
rows past its tokens, or is given back whole; a scratch table comes and goes (no session is
evicted for it). Its methods take the runtime's lock (re-entrant), which guards the session map.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from leyline_sdk.errors import CapacityExceeded

from leyline_runtime.admission import Admission
from leyline_runtime.engine.block_manager import BlockManager
from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.sessions.session import Session
from leyline_runtime.sessions.tenancy import RuntimeStats, Tenancy


class CacheRoom:
    def __init__(self, blocks: BlockManager, admission: Admission, tenancy: Tenancy, stats: RuntimeStats,
                 lock: threading.RLock, sessions: dict[tuple[str, str], Session], evicted: set[tuple[str, str]]):
        self.blocks = blocks
        self.admission = admission
        self.tenancy = tenancy
        self.stats = stats
        self.lock = lock  # the runtime's: the session map, eviction, commits and counters
        self.sessions = sessions  # the runtime's session map (eviction deletes from it)
        self.evicted = evicted

    def make_room(self, blocks: int, session: Session) -> None:
        """Evict idle sessions, least recently used first, until ``blocks`` are free for ``session``."""
        with self.lock:
            if blocks <= self.blocks.num_free:
                return
            self.admission.check_blocks(len(session.table.blocks) + blocks)
            for victim in self.tenancy.victims(self.sessions.values(), session):
                if blocks <= self.blocks.num_free:
                    break
                self.blocks.release(victim.table)
                del self.sessions[(victim.tenant, victim.session_id)]
                self.evicted.add((victim.tenant, victim.session_id))
                self.stats.evictions += 1
                self.tenancy.stats_of(victim.tenant).evictions += 1
            if blocks > self.blocks.num_free:
                raise CapacityExceeded(f"the cache is full with sessions in use or within other tenants' "
                                       f"shares ({self.blocks.num_free} blocks free, {blocks} needed)")

    def grow(self, session: Session, num_tokens: int) -> None:
        """The session's table holds ``num_tokens`` positions (room made for them first)."""
        self.admission.check_positions(num_tokens)
        with self.lock:
            self.make_room(self.blocks.blocks_for(num_tokens) - len(session.table.blocks), session)
            self.reserve(session.table, num_tokens)

    def new_table(self, num_tokens: int, session: Session) -> BlockTable:
        """A table of fresh blocks for ``num_tokens`` positions (room made for them, as for ``session``)."""
        table = BlockTable(self.blocks.block_size)
        with self.lock:
            self.make_room(self.blocks.blocks_for(num_tokens), session)
            self.reserve(table, num_tokens)
        return table

    def reserve(self, table: BlockTable, num_tokens: int) -> None:
        """``table`` holds ``num_tokens`` positions (no room made: raises CapacityExceeded when short)."""
        with self.lock:
            self.blocks.reserve(table, num_tokens)

    def trim(self, table: BlockTable, num_tokens: int) -> None:
        """``table`` gives back its blocks past the ones ``num_tokens`` positions need."""
        self.blocks.trim(table, num_tokens)

    def release(self, table: BlockTable) -> None:
        """``table`` gives back every block (a session deleted, or a table never registered)."""
        self.blocks.release(table)

    @contextmanager
    def rows_beyond(self, session: Session, num_tokens: int) -> Iterator[None]:
        """A held session's table grown to ``num_tokens`` positions for rows it does not keep: on exit it
        holds only what its tokens need again."""
        self.grow(session, num_tokens)
        try:
            yield
        finally:
            self.trim(session.table, session.num_tokens)

    @contextmanager
    def scratch_table(self, num_tokens: int) -> Iterator[BlockTable]:
        """A table of fresh blocks for ``num_tokens`` positions, given back on exit."""
        table = BlockTable(self.blocks.block_size)
        self.reserve(table, num_tokens)
        try:
            yield table
        finally:
            self.release(table)
