"""What benches and tests read and try on a runtime's sessions beyond its REST surface.

A runtime's blocks have one owner (:mod:`.engine.block_manager`) and its sessions one map,
so nothing outside this package touches them (``tests/repo/test_runtime_privacy.py``
checks). What the fidelity harness, the policy comparison, the edit and prefill benches
and the tests need of them is here instead, on the runtime's own locks and block manager:

* reading a session: its token ids, a copy of its cache rows, its blocks;
* trying something without changing it: the logits and greedy tokens after an assistant
  header, every position's logits re-queried against its cached rows;
* work no client asks for: a fork (a second session with the same rows), an append that
  returns the logits of every appended position, an exact recompute of a span of rows, a
  prefill or a plain row copy into scratch blocks to time, a shuffled free list.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from leyline_kernels.rotate_and_splice_torch import CHUNK_ROWS
from leyline_sdk.protocol import Directive, GenerateRequest, Message

from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.model.batch import BatchLayout, _clip
from leyline_runtime.runtime import DEFAULT_TENANT, Runtime
from leyline_runtime.sessions.session import Session


class Inspector:
    """``Inspector(runtime)``: every method takes a session id and the caller's tenant, as
    :class:`~.runtime.Runtime`'s do, and is serialised with the session's other work."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    # -- reading a session ----------------------------------------------------------

    def tokens(self, session_id: str, tenant: str = DEFAULT_TENANT) -> list[int]:
        with self.runtime._lock:
            return self.runtime._get(tenant, session_id).tokens

    def cache_rows(self, session_id: str, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """A copy of the session's rows, ``[num_layers, num_tokens, row_width]``, on the cache's device."""
        rows = self.runtime.pool.rows
        with self.runtime._hold(tenant, session_id) as session:
            return rows[:, session.table.rows(0, session.num_tokens, rows.device)]

    def block_ids(self, session_id: str, tenant: str = DEFAULT_TENANT) -> list[int]:
        """The cache blocks holding the session's rows, in position order."""
        with self.runtime._lock:
            return list(self.runtime._get(tenant, session_id).table.blocks)

    @property
    def free_blocks(self) -> int:
        return self.runtime.blocks.num_free

    # -- trying something without changing the session -----------------------------------

    def next_token_logits(self, session_id: str, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """The logits after an assistant header, ``[vocab]``."""
        return self._after_header(session_id, tenant, 0)[0]

    def greedy_continuation(self, session_id: str, max_tokens: int, tenant: str = DEFAULT_TENANT) -> list[int]:
        """``max_tokens`` greedy tokens after an assistant header (no stop token ends them)."""
        return self._after_header(session_id, tenant, max_tokens)[1]

    def _after_header(self, session_id: str, tenant: str, max_tokens: int) -> tuple[torch.Tensor, list[int]]:
        rt = self.runtime
        with rt._hold(tenant, session_id) as session:
            n = session.num_tokens
            rt._grow(session, n + 1 + max_tokens)
            try:
                logits = rt.engine.prefill(session.table, [rt.tokenizer.role_ids["assistant"]], n).clone()
                tokens: list[int] = []
                if max_tokens:
                    params = GenerateRequest(max_tokens=max_tokens, temperature=0.0)
                    tokens = rt.engine.decode(session.table, n + 1, logits, params, set(), rt.max_positions).tokens
                return logits, tokens
            finally:  # the rows past the session's tokens were never its own
                rt.blocks.trim(session.table, n)

    def suffix_logits(self, session_id: str, start: int, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """Logits of positions ``start..`` re-queried through every layer against the session's rows,
        ``[num_tokens - start, vocab]``: each position, as a decode step, sees the cached rows of the
        positions before it and its own fresh row. The fresh rows go to scratch blocks, so the
        cache is not written."""
        rt = self.runtime
        engine, pool = rt.engine, rt.pool
        with rt._hold(tenant, session_id) as session:
            n = session.num_tokens
            with rt._lock:
                scratch = rt.blocks.take(pool.blocks_for(n - start))
            try:
                cached = session.table.extents(n)
                own = BlockTable(pool.block_size, scratch).rows(0, n - start).tolist()
                ids = torch.tensor(session.tokens[start:], dtype=torch.long, device=engine.device)
                outs = []
                for a in range(0, n - start, engine.prefill_chunk):
                    b = min(a + engine.prefill_chunk, n - start)
                    steps = [(start + i, 1, _clip(cached, start + i) + [(own[i], 1)]) for i in range(a, b)]
                    layout = BatchLayout.build(steps, list(range(b - a)), engine.device)
                    outs.append(rt.model.forward_batch(ids[a:b], pool.rows, layout))
                return torch.cat(outs)
            finally:
                rt.blocks.release(scratch)

    def first_change(self, session_id: str, directives: list[Directive], tenant: str = DEFAULT_TENANT) -> int:
        """The first token position ``directives`` would change (validates them; changes nothing)."""
        rt = self.runtime
        with rt._lock:
            return rt.executor.plan(rt._get(tenant, session_id), directives).first_change

    # -- scratch work to time (blocks taken and given back here; no session is evicted for it) ---

    @contextmanager
    def scratch_prefill(self, token_ids: list[int]) -> Iterator[Callable[[], torch.Tensor | None]]:
        """A prefill of ``token_ids`` from position 0 into scratch blocks, as the engine prefills a
        session (the last token's logits): call it, and time it, inside the ``with``."""
        rt = self.runtime
        table = BlockTable(rt.pool.block_size)
        with rt._lock:
            rt.blocks.reserve(table, len(token_ids))
        try:
            yield lambda: rt.engine.prefill(table, token_ids, 0)
        finally:
            rt.blocks.release(table)

    @contextmanager
    def scratch_row_copy(self, session_id: str, start: int, end: int,
                         tenant: str = DEFAULT_TENANT) -> Iterator[Callable[[], None]]:
        """A plain indexed copy (``index_select`` + ``index_copy_`` in the torch kernel's row chunks)
        of the session's rows ``[start, end)``, every layer, into scratch blocks: the rows an
        amortize moves, without its rotation or its slice copies. Call it, and time it, inside
        the ``with``."""
        rt = self.runtime
        pool, n = rt.pool, end - start
        flat = pool.flat()
        with rt._hold(tenant, session_id) as session:
            with rt._lock:
                blocks = rt.blocks.take(pool.blocks_for(n))
            try:
                src = session.table.rows(start, end)
                dst = (torch.tensor(blocks)[:, None] * pool.block_size + torch.arange(pool.block_size)).flatten()[:n]
                layers = torch.arange(pool.layout.num_layers)[:, None] * pool.rows_per_layer
                src, dst = (layers + src).flatten().to(flat.device), (layers + dst).flatten().to(flat.device)

                def copy() -> None:
                    for a in range(0, len(src), CHUNK_ROWS):
                        flat.index_copy_(0, dst[a: a + CHUNK_ROWS], flat.index_select(0, src[a: a + CHUNK_ROWS]))

                yield copy
            finally:
                rt.blocks.release(blocks)

    def shuffle_free_blocks(self, seed: int = 0) -> None:
        """Hand out the free blocks in random order, as a pool after much churn does: the blocks a
        session takes next are not neighbours (``leyline-bench edit --fragment-pool``)."""
        pool = self.runtime.pool
        with self.runtime._lock, pool._lock:
            order = torch.randperm(len(pool._free), generator=torch.Generator().manual_seed(seed)).tolist()
            pool._free = [pool._free[i] for i in order]

    # -- work no client asks for ------------------------------------------------------

    def fork(self, session_id: str, tenant: str = DEFAULT_TENANT, fork_id: str | None = None) -> str:
        """A new session with this one's messages, tokens, version, drift and cache rows (bit for
        bit, no prefill); -> its id. The rows are copied into blocks of its own: the block manager
        counts no references, so two live sessions never share a block."""
        rt = self.runtime
        with rt._hold(tenant, session_id) as source:
            fork_id = fork_id or f"{session_id}-fork-{uuid.uuid4().hex[:8]}"
            rt._check_new(tenant, fork_id)
            n, rows = source.num_tokens, rt.pool.rows
            table = BlockTable(rt.pool.block_size)
            with rt._lock:
                rt._make_room(rt.pool.blocks_for(n), source)
                rt.blocks.reserve(table, n)
            try:
                rows[:, table.rows(0, n, rows.device)] = rows[:, source.table.rows(0, n, rows.device)]
            except BaseException:
                rt.blocks.release(table)
                raise
            fork = Session(fork_id, tenant, table, [m.model_copy() for m in source.messages],
                           [list(t) for t in source.message_tokens], version=source.version,
                           drift=source.drift.copy())
        rt._register(fork)
        return fork_id

    def append_scored(self, session_id: str, messages: list[Message], tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """Append ``messages`` as :meth:`Runtime.append` does; -> the logits of every appended position
        and of an assistant header after them, ``[T + 1, vocab]`` (one forward: the header is not kept)."""
        if not messages:
            return self.next_token_logits(session_id, tenant)[None]
        rt = self.runtime
        with rt._hold(tenant, session_id) as session:
            _, logits = rt._append(session, messages, then=[rt.tokenizer.role_ids["assistant"]], logits="all")
            rt.blocks.trim(session.table, session.num_tokens)
            return logits

    def recompute(self, session_id: str, start: int, end: int, tenant: str = DEFAULT_TENANT) -> int:
        """Recompute the session's rows ``[start, end)`` against the rows before them (copy-on-write,
        committed by swapping its table; rows from ``end`` on are not touched); -> the rows
        recomputed, counted as the session's recomputed tokens.

        Rows before the earliest drifted position are exact, so when ``[start, end)`` holds it
        the recomputed rows are exact too and the earliest drifted position moves to ``end``.
        """
        rt = self.runtime
        with rt._hold(tenant, session_id) as session:
            if start >= end:
                return 0
            with rt._lock:
                rt._make_room(rt.pool.blocks_for(end) - start // rt.pool.block_size, session)
            rt.executor.recompute(session, start, end)
            with rt._lock:
                drift = session.drift
                if drift.earliest is not None and start <= drift.earliest < end:
                    if end < session.num_tokens:
                        drift.moved(end)
                    else:  # every row from start on: the session is exact again
                        drift.recomputed_from(start)
            rt._tally(session, recomputed=end - start)
            return end - start
