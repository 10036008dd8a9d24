"""The engine: one thread runs every model step; callers submit sequences and wait.

Sessions never share a lock around model work: whatever thread asks for a
prefill or a generation hands the engine a :class:`Sequence` and waits for
its result, while the engine thread batches all running sequences into
one forward per step (decode steps of every generation, plus prefill chunks
under a token budget; see :mod:`.scheduler`). Sampling, stop rules and
logprobs run per sequence on the engine thread, and so does a generation's
``on_token`` hook: handing each token to a waiting thread woke one thread per
sequence per step, and those wake-ups took the interpreter lock from the
engine thread (16 streamed sessions: about 10% of their tokens/s). A hook
raising ends its own sequence only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from leyline_sdk.protocol import SamplingParams

from leyline_runtime.engine.stats import EngineStats
from leyline_runtime.engine.generation import Generation, GenerationState
from leyline_runtime.engine.block_manager import BlockManager
from leyline_runtime.engine.kv_cache import BlockPool, BlockTable
from leyline_runtime.model import DeepseekForCausalLM
from leyline_runtime.engine.model_runner import ModelRunner
from leyline_runtime.engine.sampling import LogitsProcessor
from leyline_runtime.engine.scheduler import Chunk, Scheduler
from leyline_runtime.engine.sequence import Sequence, Status

__all__ = ["Engine", "Generation"]

log = logging.getLogger("leyline.engine")


class Engine:
    def __init__(self, model: DeepseekForCausalLM, pool: BlockPool, prefill_chunk: int = 8192,
                 max_batched_tokens: int = 512, max_num_seqs: int = 64, batch_invariant: bool = False):
        self.model = model
        self.pool = pool
        self.blocks = BlockManager(pool)  # the one owner of the pool's blocks
        self.runner = ModelRunner(model, pool, batch_invariant)
        self.scheduler = Scheduler(max_batched_tokens, prefill_chunk, max_num_seqs,
                                   invariant_chunk=max_batched_tokens if batch_invariant else None)
        self.stats = EngineStats()
        self._wakeup = threading.Condition()
        self._inbox: list[Sequence] = []
        self._thread: threading.Thread | None = None

    @property
    def device(self) -> torch.device:
        return self.pool.rows.device

    @property
    def prefill_chunk(self) -> int:
        """The most tokens one forward prefills (activation memory bound)."""
        return self.scheduler.max_prefill_tokens

    @prefill_chunk.setter
    def prefill_chunk(self, value: int) -> None:
        self.scheduler.max_prefill_tokens = value

    # -- what callers ask for (any thread) ---------------------------------------------

    def prefill(self, table: BlockTable, tokens: list[int], start: int,
                logits: str = "last") -> torch.Tensor | None:
        """Compute rows for ``tokens`` at positions ``start..``; the table must hold them.

        Attention sees the rows of positions ``< start`` already in the table.
        ``logits``: "last" -> [vocab] of the last token, "all" -> [T, vocab], "none".
        """
        return self.prefill_runs(table, [(start, tokens)], logits)

    def prefill_runs(self, table: BlockTable, runs: list[tuple[int, list[int]]],
                     logits: str = "none") -> torch.Tensor | None:
        """Prefill several runs ``(start, tokens)`` of one table, in position order, as one piece of work.

        A run sees the rows of the runs before it, so they may share a forward.
        Logits ("last" / "all") are those of the last run.
        """
        seqs, before = [], None
        for start, tokens in runs:
            if tokens:
                before = Sequence(table, start, list(tokens), logits="none", after=before)
                seqs.append(before)
        if not seqs:
            return None
        seqs[-1].logits = logits
        self._submit(*seqs)
        result, error = None, None
        for seq in seqs:  # every run is waited for: the table is the caller's again only then
            try:
                result = self._wait(seq)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return result

    def decode(self, table: BlockTable, num_cached: int, first_logits: torch.Tensor,
               params: SamplingParams, stop_ids: set[int], max_positions: int,
               decode_text=None, on_token: Callable[[int], None] | None = None,
               processors: list[LogitsProcessor] | None = None) -> Generation:
        """Sample from ``first_logits`` on, writing each sampled token's row.

        A sampled stop id ends generation without its row being written (the
        caller decides what closes the message). ``decode_text(ids) -> str`` is
        needed for stop strings. ``on_token(id)`` sees every sampled token (stop
        ids included) as soon as it is chosen, on the engine thread (between two
        steps of every running sequence: it must be quick and must not block);
        an exception it raises ends the generation with that exception and the
        table's rows are the caller's again. ``processors`` change the logits
        before each choice (logprobs report the model's own distribution).
        """
        state = GenerationState.create(params, stop_ids, num_cached, max_positions, decode_text, processors)
        seq = Sequence(table, num_cached, [], generation=state, first_logits=first_logits, on_token=on_token)
        self._submit(seq)
        return self._wait(seq)

    # -- the waiting side ---------------------------------------------------------------

    def _submit(self, *seqs: Sequence) -> None:
        if threading.current_thread() is self._thread:  # e.g. an on_token hook: it would wait for itself
            raise RuntimeError("engine work was asked for on the engine thread (from an on_token hook?)")
        with self._wakeup:
            self._inbox.extend(seqs)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="leyline-engine", daemon=True)
                self._thread.start()
            self._wakeup.notify()

    @staticmethod
    def _wait(seq: Sequence):
        kind, value = seq.done.get()
        if kind == "error":
            raise value
        return value

    # -- the engine thread --------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._inbox and not self.scheduler.has_work():
                    self._wakeup.wait()
                inbox, self._inbox = self._inbox, []
            for seq in inbox:
                self._admit(seq)
            chunks = self.scheduler.schedule()
            if chunks:
                started = time.perf_counter()
                self._step(chunks)
                self.stats.record(sum(seq.generation is not None for seq, _ in chunks), len(chunks),
                                  sum(n for _, n in chunks), time.perf_counter() - started)

    def _admit(self, seq: Sequence) -> None:
        self.scheduler.add(seq)
        if seq.generation is not None:
            self._sample(seq, seq.first_logits)
            seq.first_logits = None

    def _step(self, chunks: list[Chunk]) -> None:
        try:
            outputs = self.runner.run(chunks)
        except Exception as exc:  # noqa: BLE001 - the step's sequences fail, the engine goes on
            for seq, _ in chunks:
                self._fail(seq, exc)
            return
        for (seq, n), out in zip(chunks, outputs):
            seq.num_computed += n
            if seq.generation is not None:
                self._sample(seq, out[0])
                continue
            if out is not None:
                seq.outputs.append(out)
            if not seq.num_pending:
                self._finish(seq, _prefill_result(seq))

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> None:
        try:
            token, done = seq.generation.step(logits)
            if seq.on_token is not None:
                seq.on_token(token)
            if done is not None:
                self._finish(seq, done)
                return
            seq.tokens.append(token)
            self.blocks.reserve(seq.table, seq.start + len(seq.tokens))
        # a processor, the hook or the cache failing ends this sequence only; BaseException too (a
        # hook may raise CancelledError or GeneratorExit): the engine thread ending would hang every caller
        except BaseException as exc:  # noqa: BLE001
            self._fail(seq, exc)

    def _finish(self, seq: Sequence, result) -> None:
        self.scheduler.remove(seq)
        seq.done.put(("done", result))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        if seq.status is Status.FINISHED:
            return
        self.scheduler.remove(seq)
        seq.done.put(("error", exc))


def _prefill_result(seq: Sequence) -> torch.Tensor | None:
    if seq.logits == "all":
        return torch.cat(seq.outputs)
    if seq.logits == "last":
        return seq.outputs[-1][-1]
    return None
