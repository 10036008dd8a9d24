"""What benches and tests read and try on a runtime's sessions beyond its REST surface.

A runtime's blocks have one owner (:mod:`.engine.block_manager`) and its sessions one map,
so nothing outside this package touches them (``tests/repo/test_runtime_privacy.py``
checks), and this module is built on the runtime's public primitives alone (the same test
checks it uses no private): :meth:`~.runtime.Runtime.hold` (a session, serialised with its
other work), ``runtime.room`` (:class:`~.cache_room.CacheRoom`: rows past a session's tokens
for a trial, scratch tables), :meth:`~.runtime.Runtime.prefill_messages` (a scored prefill),
:meth:`~.runtime.Runtime.fork_session` and :meth:`~.runtime.Runtime.recompute`. What the
fidelity harness, the policy comparison, the edit and prefill benches and the tests need:

* reading a session: its token ids, a copy of its cache rows, its blocks;
* trying something without changing it: the logits and greedy tokens after an assistant
  header, every position's logits re-queried against its cached rows;
* work no client asks for: a fork (a second session with the same rows), an append that
  returns the logits of every appended position, an exact recompute of a span of rows, a
  prefill or a plain row copy into scratch blocks to time, a shuffled free list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from leyline_kernels.rotate_and_splice_torch import CHUNK_ROWS
from leyline_sdk.protocol import Directive, GenerateRequest, Message

from leyline_runtime.model.batch import BatchLayout
from leyline_runtime.runtime import DEFAULT_TENANT, Runtime


class Inspector:
    """``Inspector(runtime)``: every method takes a session id and the caller's tenant, as
    :class:`~.runtime.Runtime`'s do, and is serialised with the session's other work."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    # -- reading a session ----------------------------------------------------------

    def tokens(self, session_id: str, tenant: str = DEFAULT_TENANT) -> list[int]:
        with self.runtime.hold(session_id, tenant) as session:
            return session.tokens

    def cache_rows(self, session_id: str, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """A copy of the session's rows, ``[num_layers, num_tokens, row_width]``, on the cache's device."""
        rows = self.runtime.pool.rows
        with self.runtime.hold(session_id, tenant) as session:
            return rows[:, session.table.rows(0, session.num_tokens, rows.device)]

    def block_ids(self, session_id: str, tenant: str = DEFAULT_TENANT) -> list[int]:
        """The cache blocks holding the session's rows, in position order."""
        with self.runtime.hold(session_id, tenant) as session:
            return list(session.table.blocks)

    @property
    def free_blocks(self) -> int:
        return self.runtime.pool.num_free

    # -- trying something without changing the session -----------------------------------

    def next_token_logits(self, session_id: str, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """The logits after an assistant header, ``[vocab]``."""
        return self._after_header(session_id, tenant, 0)[0]

    def greedy_continuation(self, session_id: str, max_tokens: int, tenant: str = DEFAULT_TENANT) -> list[int]:
        """``max_tokens`` greedy tokens after an assistant header (no stop token ends them)."""
        return self._after_header(session_id, tenant, max_tokens)[1]

    def _after_header(self, session_id: str, tenant: str, max_tokens: int) -> tuple[torch.Tensor, list[int]]:
        rt = self.runtime
        with rt.hold(session_id, tenant) as session:
            n = session.num_tokens
            with rt.room.rows_beyond(session, n + 1 + max_tokens):  # never the session's own
                logits = rt.engine.prefill(session.table, [rt.tokenizer.role_ids["assistant"]], n).clone()
                tokens: list[int] = []
                if max_tokens:
                    params = GenerateRequest(max_tokens=max_tokens, temperature=0.0)
                    tokens = rt.engine.decode(session.table, n + 1, logits, params, set(), rt.max_positions).tokens
                return logits, tokens

    def suffix_logits(self, session_id: str, start: int, tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """Logits of positions ``start..`` re-queried through every layer against the session's rows,
        ``[num_tokens - start, vocab]``: each position, as a decode step, sees the cached rows of the
        positions before it and its own fresh row. The fresh rows go to scratch blocks, so the
        cache is not written."""
        rt = self.runtime
        engine = rt.engine
        with rt.hold(session_id, tenant) as session:
            n = session.num_tokens
            with rt.room.scratch_table(n - start) as scratch:
                own = scratch.rows(0, n - start).tolist()
                ids = torch.tensor(session.tokens[start:], dtype=torch.long, device=engine.device)
                outs = []
                for a in range(0, n - start, engine.prefill_chunk):
                    b = min(a + engine.prefill_chunk, n - start)
                    steps = [(start + i, 1, session.table.extents(start + i) + [(own[i], 1)]) for i in range(a, b)]
                    layout = BatchLayout.build(steps, list(range(b - a)), engine.device)
                    outs.append(rt.model.forward_batch(ids[a:b], rt.pool.rows, layout))
                return torch.cat(outs)

    def first_change(self, session_id: str, directives: list[Directive], tenant: str = DEFAULT_TENANT) -> int:
        """The first token position ``directives`` would change (validates them; changes nothing)."""
        with self.runtime.hold(session_id, tenant) as session:
            return self.runtime.executor.plan(session, directives).first_change

    # -- scratch work to time (blocks taken and given back here; no session is evicted for it) ---

    @contextmanager
    def scratch_prefill(self, token_ids: list[int]) -> Iterator[Callable[[], torch.Tensor | None]]:
        """A prefill of ``token_ids`` from position 0 into scratch blocks, as the engine prefills a
        session (the last token's logits): call it, and time it, inside the ``with``."""
        rt = self.runtime
        with rt.room.scratch_table(len(token_ids)) as table:
            yield lambda: rt.engine.prefill(table, token_ids, 0)

    @contextmanager
    def scratch_row_copy(self, session_id: str, start: int, end: int,
                         tenant: str = DEFAULT_TENANT) -> Iterator[Callable[[], None]]:
        """A plain indexed copy (``index_select`` + ``index_copy_`` in the torch kernel's row chunks)
        of the session's rows ``[start, end)``, every layer, into scratch blocks: the rows an
        amortize moves, without its rotation or its slice copies. Call it, and time it, inside
        the ``with``."""
        rt = self.runtime
        pool = rt.pool
        flat = pool.flat()
        with rt.hold(session_id, tenant) as session, rt.room.scratch_table(end - start) as scratch:
            layers = torch.arange(pool.layout.num_layers)[:, None] * pool.rows_per_layer
            src = (layers + session.table.rows(start, end)).flatten().to(flat.device)
            dst = (layers + scratch.rows(0, end - start)).flatten().to(flat.device)

            def copy() -> None:
                for a in range(0, len(src), CHUNK_ROWS):
                    flat.index_copy_(0, dst[a: a + CHUNK_ROWS], flat.index_select(0, src[a: a + CHUNK_ROWS]))

            yield copy

    def shuffle_free_blocks(self, seed: int = 0) -> None:
        """Hand out the free blocks in random order, as a pool after much churn does: the blocks a
        session takes next are not neighbours (``leyline-bench edit --fragment-pool``)."""
        self.runtime.pool.shuffle_free(seed)

    # -- work no client asks for ------------------------------------------------------

    def fork(self, session_id: str, tenant: str = DEFAULT_TENANT, fork_id: str | None = None) -> str:
        """:meth:`.runtime.Runtime.fork_session`: a second session with the same rows, bit for bit."""
        return self.runtime.fork_session(session_id, tenant, fork_id)

    def append_scored(self, session_id: str, messages: list[Message], tenant: str = DEFAULT_TENANT) -> torch.Tensor:
        """Append ``messages`` as :meth:`Runtime.append` does; -> the logits of every appended position
        and of an assistant header after them, ``[T + 1, vocab]`` (one forward: the header is not kept)."""
        if not messages:
            return self.next_token_logits(session_id, tenant)[None]
        rt = self.runtime
        with rt.hold(session_id, tenant) as session:
            _, logits = rt.prefill_messages(session, messages, then=[rt.tokenizer.role_ids["assistant"]],
                                            logits="all")
            rt.room.trim(session.table, session.num_tokens)
            return logits

    def recompute(self, session_id: str, start: int, end: int, tenant: str = DEFAULT_TENANT) -> int:
        """:meth:`.runtime.Runtime.recompute`: rows ``[start, end)`` recomputed exactly; -> how many."""
        return self.runtime.recompute(session_id, start, end, tenant)
