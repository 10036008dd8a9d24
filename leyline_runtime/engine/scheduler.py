"""Which tokens of which sequences go into the next batched forward.

Every generating sequence decodes one token per step; prefill chunks fill
the rest of a token budget, first come first served, so a long prompt is
split across steps while others decode beside it. With nobody decoding, a
prefill runs in chunks as large as memory allows (``max_prefill_tokens``).
Generations beyond ``max_num_seqs`` take turns (round robin).

Batch-invariant mode (``invariant_chunk``): a prefill is cut at every
``invariant_chunk`` tokens from its start and nowhere else, whatever else
runs, so its rows are computed by the same products alone or batched (a
step may then pass the budget by less than one chunk).
"""

from __future__ import annotations

from collections import deque

from leyline_runtime.engine.sequence import Sequence, Status

Chunk = tuple[Sequence, int]  # a sequence and how many of its pending tokens run this step


class Scheduler:
    def __init__(self, max_batched_tokens: int = 512, max_prefill_tokens: int = 8192, max_num_seqs: int = 64,
                 invariant_chunk: int | None = None):
        self.max_batched_tokens = max_batched_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.max_num_seqs = max_num_seqs
        self.invariant_chunk = invariant_chunk
        self.prefilling: deque[Sequence] = deque()
        self.decoding: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        seq.status = Status.RUNNING
        (self.decoding if seq.generation is not None else self.prefilling).append(seq)

    def has_work(self) -> bool:
        return bool(self.prefilling or self.decoding)

    def remove(self, seq: Sequence) -> None:
        seq.status = Status.FINISHED
        queue = self.decoding if seq.generation is not None else self.prefilling
        if seq in queue:
            queue.remove(seq)

    def schedule(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        decoders = [s for s in self.decoding if s.num_pending][: self.max_num_seqs]
        if len(self.decoding) > self.max_num_seqs:
            self.decoding.rotate(-len(decoders))  # the others go first next step
        chunks += [(s, 1) for s in decoders]
        budget = max(self.max_batched_tokens - len(decoders), 1) if decoders else self.max_prefill_tokens
        budget = min(budget, self.max_prefill_tokens)
        for seq in self.prefilling:
            if budget <= 0:
                break
            if seq.after is not None and not _caught_up(seq.after, chunks):
                continue
            n = self._chunk_size(seq, budget)
            chunks.append((seq, n))
            budget -= n
        return chunks

    def _chunk_size(self, seq: Sequence, budget: int) -> int:
        if self.invariant_chunk is None:
            return min(seq.num_pending, budget)
        return min(seq.num_pending, self.invariant_chunk - seq.num_computed % self.invariant_chunk)


def _caught_up(earlier: Sequence, chunks: list[Chunk]) -> bool:
    """The earlier run is done, or finishes in this step (its rows are written layer by layer before ours)."""
    if earlier.status is Status.FINISHED:
        return True
    return any(seq is earlier and n == seq.num_pending for seq, n in chunks)
