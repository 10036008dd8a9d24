"""Where the tokens of one batched forward sit: positions, cache rows, attention segments.

A batch mixes sequences. Each token's latent row is written to ``write_rows``;
attention then runs per group: every prefill segment (a run of consecutive
positions of one sequence) attends causally over its own rows and the rows of
the positions before it, and all single-token queries (decode steps) attend
together, padded to the longest, each over its own sequence's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillSegment:
    tokens: slice  # rows of the flattened batch
    start: int  # position of its first token
    read_rows: torch.Tensor  # pool row of each position 0 .. start + n


@dataclass
class DecodeGroup:
    tokens: torch.Tensor  # rows of the flattened batch (one query each, at its sequence's last position)
    read_rows: torch.Tensor  # [B, longest] pool rows of positions 0 .. (padding rows repeat row 0)
    valid: torch.Tensor | None  # [B, longest] real (not padding) keys; None when nothing is padded


@dataclass
class BatchLayout:
    positions: torch.Tensor  # [N]
    write_rows: torch.Tensor  # [N] pool row of each token
    prefills: list[PrefillSegment]
    decodes: DecodeGroup | None
    logit_rows: torch.Tensor  # rows of the batch whose next-token logits are wanted

    @classmethod
    def build(cls, segments: list[tuple[int, torch.Tensor, int]], logit_rows: list[int],
              device: torch.device) -> BatchLayout:
        """``segments``: (start position, pool rows of positions 0 .. start + n, n) per sequence chunk."""
        positions, write_rows, prefills, dec_tokens, dec_rows = [], [], [], [], []
        offset = 0
        for start, rows, n in segments:
            positions.append(torch.arange(start, start + n))
            write_rows.append(rows[start:start + n])
            if n == 1:
                dec_tokens.append(offset)
                dec_rows.append(rows[: start + 1])
            else:
                prefills.append(PrefillSegment(slice(offset, offset + n), start, rows[: start + n].to(device)))
            offset += n
        decodes = None
        if dec_tokens:
            lengths = torch.tensor([len(r) for r in dec_rows])
            padded = torch.nn.utils.rnn.pad_sequence(dec_rows, batch_first=True)
            valid = None
            if int(lengths.min()) != padded.shape[1]:
                valid = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).to(device)
            decodes = DecodeGroup(torch.tensor(dec_tokens, device=device), padded.to(device), valid)
        return cls(torch.cat(positions).to(device), torch.cat(write_rows).to(device), prefills, decodes,
                   torch.tensor(logit_rows, dtype=torch.long, device=device))
