"""Where the tokens of one batched forward sit: positions, cache rows, attention segments.

A batch mixes sequences. Each token's latent row is written to ``write_rows``;
attention then runs per sequence: a prefill segment (a run of consecutive
positions) attends causally over its own rows and over the rows of the
positions before it, a decode step (one query at its sequence's last
position) over all its sequence's rows. Earlier rows are read in place, as
runs of consecutive pool rows (``Extents``); a table split into many runs is
gathered into one tensor instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Extents = list[tuple[int, int]]  # (first pool row, number of rows), in position order

#: more runs than this are gathered into one tensor (one product beats many small ones)
MAX_EXTENTS = 8
#: decode steps attend together (one padded gather) while batch size x longest sequence stays
#: under this many rows (a few tens of MB per layer); longer ones read their rows in place
MAX_DECODE_GATHER_ROWS = 1 << 16


def read_rows(pool: torch.Tensor, extents: Extents, max_parts: int = MAX_EXTENTS) -> list[torch.Tensor]:
    """The rows of ``extents`` as views of ``pool``, or one gathered copy when there are more than
    ``max_parts`` runs."""
    parts = [pool[row: row + n] for row, n in extents]
    if len(parts) > max_parts:
        return [torch.cat(parts)]
    return parts


@dataclass
class PrefillSegment:
    tokens: slice  # rows of the flattened batch
    start: int  # position of its first token
    prefix: Extents  # pool rows of positions 0 .. start


@dataclass
class DecodeStep:
    token: int  # row of the flattened batch
    rows: Extents  # pool rows of positions 0 .. its own (written this step)


@dataclass
class DecodeGather:
    """The rows of every decode step, padded to the longest: ``rows`` [B, L] pool rows,
    ``bias`` [B, 1, L] fp32 (0 for a real row, -inf for padding)."""

    rows: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def build(cls, steps: list[DecodeStep], device: torch.device) -> DecodeGather | None:
        lengths = [sum(n for _, n in step.rows) for step in steps]
        longest = max(lengths)
        if len(steps) < 2 or len(steps) * longest > MAX_DECODE_GATHER_ROWS:
            return None
        rows = torch.zeros(len(steps), longest, dtype=torch.long)
        bias = torch.full((len(steps), 1, longest), float("-inf"))
        for b, (step, n) in enumerate(zip(steps, lengths)):
            rows[b, :n] = _rows_of(step.rows, 0, n)
            bias[b, :, :n] = 0.0
        return cls(rows.to(device), bias.to(device))


@dataclass
class BatchLayout:
    positions: torch.Tensor  # [N]
    write_rows: torch.Tensor  # [N] pool row of each token
    prefills: list[PrefillSegment]
    decodes: list[DecodeStep]
    decode_tokens: torch.Tensor  # [len(decodes)] rows of the flattened batch
    logit_rows: torch.Tensor  # rows of the batch whose next-token logits are wanted
    decode_gather: DecodeGather | None = None  # None: each decode step reads its rows in place

    @classmethod
    def build(cls, segments: list[tuple[int, int, Extents]], logit_rows: list[int],
              device: torch.device, gather: bool = True) -> BatchLayout:
        """``segments``: (start position, n tokens, pool rows of positions 0 .. start + n) per sequence chunk.

        ``gather=False``: decode steps read their rows in place (no padded gather)."""
        positions, write_rows, prefills, decodes = [], [], [], []
        offset = 0
        for start, n, extents in segments:
            positions.append(torch.arange(start, start + n))
            write_rows.append(_rows_of(extents, start, start + n))
            if n == 1:
                decodes.append(DecodeStep(offset, extents))
            else:
                prefills.append(PrefillSegment(slice(offset, offset + n), start, _clip(extents, start)))
            offset += n
        return cls(torch.cat(positions).to(device), torch.cat(write_rows).to(device), prefills, decodes,
                   torch.tensor([d.token for d in decodes], dtype=torch.long, device=device),
                   torch.tensor(logit_rows, dtype=torch.long, device=device),
                   DecodeGather.build(decodes, device) if decodes and gather else None)


def _clip(extents: Extents, end: int) -> Extents:
    """The runs covering positions ``[0, end)``."""
    out, seen = [], 0
    for row, n in extents:
        if seen >= end:
            break
        take = min(n, end - seen)
        out.append((row, take))
        seen += take
    return out


def _rows_of(extents: Extents, start: int, end: int) -> torch.Tensor:
    """Pool row of each position in ``[start, end)``."""
    pieces, seen = [], 0
    for row, n in extents:
        lo, hi = max(start, seen), min(end, seen + n)
        if lo < hi:
            pieces.append(torch.arange(row + lo - seen, row + hi - seen))
        seen += n
    return torch.cat(pieces)
