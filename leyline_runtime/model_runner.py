"""Turn a scheduled step into one batched forward over the sequences' block tables."""

from __future__ import annotations

import torch

from .kv_cache import BlockPool
from .model import DeepseekForCausalLM
from .model.batch import BatchLayout, GatherScratch
from .scheduler import Chunk


class ModelRunner:
    def __init__(self, model: DeepseekForCausalLM, pool: BlockPool):
        self.model = model
        self.pool = pool
        self.scratch = GatherScratch()  # decode gathers of every step land here

    @property
    def device(self) -> torch.device:
        return self.pool.rows.device

    def run(self, chunks: list[Chunk]) -> list[torch.Tensor | None]:
        """Compute every chunk's tokens; -> per chunk its wanted logits [k, vocab] (None: none wanted)."""
        segments, ids, logit_rows, wanted = [], [], [], []
        offset = 0
        for seq, n in chunks:
            start = seq.position
            segments.append((start, n, seq.table.extents(start + n)))
            ids.extend(seq.tokens[seq.num_computed: seq.num_computed + n])
            k = seq.wants_logits(n)
            logit_rows.extend(range(offset + n - k, offset + n))
            wanted.append(k)
            offset += n
        layout = BatchLayout.build(segments, logit_rows, self.device, gather=not self.model.batch_invariant,
                                    scratch=self.scratch)
        logits = self.model.forward_batch(torch.tensor(ids, dtype=torch.long, device=self.device),
                                          self.pool.rows, layout)
        outs, at = [], 0
        for k in wanted:
            outs.append(logits[at: at + k] if k else None)
            at += k
        return outs
