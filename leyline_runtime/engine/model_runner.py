"""Turn a scheduled step into one batched forward over the sequences' block tables."""

from __future__ import annotations

import torch

from leyline_runtime.engine.kv_cache import BlockPool
from leyline_runtime.model import DeepseekForCausalLM
from leyline_runtime.model.batch import BatchLayout, GatherScratch
from leyline_runtime.model.layers import invariant_products
from leyline_runtime.engine.scheduler import Chunk


class ModelRunner:
    """``batch_invariant``: a sequence's logits do not depend on what it is batched with: every
    product over a step's rows gets at least :data:`.model.layers.INVARIANT_ROWS` rows and each
    sequence attends alone, over its rows gathered into one tensor (the scheduler also cuts
    prefills at fixed points). Costs a lone decode step padded products."""

    def __init__(self, model: DeepseekForCausalLM, pool: BlockPool, batch_invariant: bool = False):
        self.model = model
        self.pool = pool
        self.batch_invariant = batch_invariant
        self.scratch = GatherScratch()  # every step's group gathers land here

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
        layout = BatchLayout.build(segments, logit_rows, self.device, gather=not self.batch_invariant,
                                    scratch=self.scratch, block_size=self.pool.block_size)
        with invariant_products(self.batch_invariant):
            logits = self.model.forward_batch(torch.tensor(ids, dtype=torch.long, device=self.device),
                                              self.pool.rows, layout)
        outs, at = [], 0
        for k in wanted:
            outs.append(logits[at: at + k] if k else None)
            at += k
        return outs
