"""Where the tokens of one batched forward sit: positions, cache rows, attention segments.

A batch mixes sequences. Each token's latent row is written to ``write_rows``;
attention then runs per sequence: a prefill segment (a run of consecutive
positions) attends causally over its own rows and over the rows of the
positions before it, a decode step (one query at its sequence's last
position) over all its sequence's rows. Earlier rows are read in place, as
runs of consecutive pool rows (``Extents``); a table split into many runs is
gathered into one tensor instead.

Short prefill runs (a new user message or tool result) of several sequences
attend together: a :class:`GatherGroup` runs one padded product over one
gather of their rows, as a prefill alone costs a few dozen small operators
per layer (one forward of eleven 4-token runs beside 5 decode steps, 150-550
rows each: 32.8 ms grouped vs 49-61 ms one at a time; over 100-2000 rows the
difference was within noise). Decode steps do so over histories of up to 768
rows. A group copies whole cache blocks (one copy per 16 rows); gathered row by
row, grouping decodes paid only up to ~256 rows (16 steps at 256 rows: 19.6 ms
gathered, 21.0 in place; at 512: 24.9 vs 24.3; 32 steps over 500-1500 rows:
72.8 vs 52.7 ms). By blocks, in one process with the orders shuffled (one
forward of 16 decode steps, 1 thread, AMD EPYC): 300-540 rows 18.7 ms grouped
up to 2000 rows vs 20.5 up to 256; 400-900: 23.4 vs 24.9; 300-900 grouped up to
1024: 24.8 vs 25.5; 100-250 (grouped either way) and 32 steps over 500-1500
within noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

Extents = list[tuple[int, int]]  # (first pool row, number of rows), in position order

#: more runs than this are gathered into one tensor (one product beats many small ones)
MAX_EXTENTS = 8
#: a group attends together (one padded gather) while its size x longest sequence stays under
#: this many rows (tens of MB per layer); otherwise its members read their rows in place
MAX_GATHER_ROWS = 1 << 16
#: prefill runs of at most this many tokens attend in a group (with each other, not with decodes)
MAX_GROUPED_PREFILL = 32
#: decode steps over at most this many rows attend in a group (with each other)
MAX_GROUPED_DECODE_ROWS = 768
#: a group's padded work (members x query slots x rows) stays within this factor of its members'
#: own: a short sequence padded to a long one's rows costs more than attending alone (counted before
#: the rows round up to whole blocks, which adds at most block size - 1 rows per member)
MAX_GROUP_PADDING = 1.3


def read_rows(pool: torch.Tensor, extents: Extents, max_parts: int = MAX_EXTENTS) -> list[torch.Tensor]:
    """The rows of ``extents`` as views of ``pool``, or one gathered copy when there are more than
    ``max_parts`` runs."""
    parts = [pool[row: row + n] for row, n in extents]
    if len(parts) > max_parts:
        return [torch.cat(parts)]
    return parts


class Run(NamedTuple):
    """A sequence's tokens in the batch: ``n`` of them from batch row ``first``, at positions
    ``start ..``, whose sequence's rows (positions ``0 .. start + n``) lie at ``extents``."""

    first: int
    n: int
    start: int
    extents: Extents

    @property
    def rows(self) -> int:
        return self.start + self.n

    @property
    def work(self) -> int:
        """Queries x rows: what its attention costs."""
        return self.n * self.rows


@dataclass
class PrefillSegment:
    tokens: slice  # rows of the flattened batch
    start: int  # position of its first token
    prefix: Extents  # pool rows of positions 0 .. start


@dataclass
class DecodeStep:
    token: int  # row of the flattened batch
    rows: Extents  # pool rows of positions 0 .. its own (written this step)


class GatherScratch:
    """One reusable buffer for gathered rows, grown as needed.

    A group's gather can be tens of MB per layer; allocating it fresh for
    every layer of every step makes the allocator hand the pages back and
    fault them in again each time (measured: 600 rows x 16 sequences of 576
    fp32 columns, 4.7 ms per gather fresh vs 1.8 ms into a kept buffer). Used by one thread at a time
    (the engine's); at most ``MAX_GATHER_ROWS`` rows are ever kept.
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def rows(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised [n, width] tensor of ``like``'s dtype, device and row width."""
        buf = self._buffer
        if (buf is None or buf.shape[0] < n or buf.shape[1:] != like.shape[1:]
                or buf.dtype != like.dtype or buf.device != like.device):
            buf = self._buffer = like.new_empty(n, *like.shape[1:])
        return buf[:n]


@dataclass
class GatherGroup:
    """Sequences whose few queries attend together over one padded gather of their rows.

    Member ``s`` has ``n_s`` queries (1 for a decode step) at positions
    ``start_s ..``; query ``t`` sees rows ``0 .. start_s + t``. Padded to ``Q``
    query slots and ``L`` rows per member: ``slots`` [S, Q] indexes the
    members' queries in order (a padding slot repeats a real one), ``real``
    [n] the real slots of the flattened [S * Q], ``tokens`` [n] their rows of
    the flattened batch, ``bias`` [S, 1, Q, L] fp32 (0 where a query may look,
    -inf elsewhere). ``index`` [S * L / unit] is what :meth:`read` copies:
    whole cache blocks (``unit`` = block size: each member's blocks in order,
    ``L`` a multiple of it), or single pool rows (``unit`` 1).
    """

    slots: torch.Tensor
    real: torch.Tensor
    tokens: torch.Tensor
    index: torch.Tensor
    unit: int
    bias: torch.Tensor
    scratch: GatherScratch

    @classmethod
    def build(cls, members: list[Run], device: torch.device, scratch: GatherScratch | None = None,
              block_size: int = 1) -> GatherGroup | None:
        """None where a group does not pay (fewer than two members) or would gather too many rows.

        ``block_size``: the pool's; whole blocks are gathered where each member's runs of rows are
        whole blocks but for its last (a table's always are). A block of 16 rows is one copy instead
        of 16 (16 sequences x 540 rows of 160 fp32 columns: 0.21 ms by blocks, 0.71 ms by rows)."""
        extents = [_clip(m.extents, m.rows) for m in members]
        unit = block_size if all(_whole_blocks(e, block_size) for e in extents) else 1
        S, Q = len(members), max(m.n for m in members)
        L = -(-max(m.rows for m in members) // unit) * unit
        if S < 2 or S * L > MAX_GATHER_ROWS:
            return None
        index = torch.zeros(S, L // unit, dtype=torch.long)  # padding: row / block 0, hidden by the bias
        slots, real, tokens, last_seen = torch.empty(S, Q, dtype=torch.long), [], [], []
        at = 0
        for s, m in enumerate(members):
            units = _rows_of(m.extents, 0, m.rows) if unit == 1 else _blocks_of(extents[s], unit)
            index[s, :len(units)] = units
            slots[s] = torch.arange(at, at + Q).clamp(max=at + m.n - 1)
            real.extend(range(s * Q, s * Q + m.n))
            tokens.extend(range(m.first, m.first + m.n))
            # the last row each slot may see (a padding slot: its member's last)
            last_seen.append(torch.arange(m.start, m.start + Q).clamp(max=m.rows - 1))
            at += m.n
        visible = torch.arange(L)[None, None, :] <= torch.stack(last_seen)[:, :, None]  # [S, Q, L]
        bias = torch.zeros(S, 1, Q, L).masked_fill(~visible[:, None], float("-inf"))
        return cls(slots.to(device), torch.tensor(real, device=device), torch.tensor(tokens, device=device),
                   index.flatten().to(device), unit, bias.to(device), scratch or GatherScratch())

    @property
    def shape(self) -> tuple[int, int, int]:
        """(members S, query slots Q, rows L)."""
        S, _, Q, L = self.bias.shape
        return S, Q, L

    def read(self, pool: torch.Tensor) -> torch.Tensor:
        """The padded rows [S, L, width] out of one layer's pool (into the scratch buffer:
        valid until the next read)."""
        S, _, L = self.shape
        units = pool.view(-1, self.unit * pool.shape[-1])  # a block's rows are one row of this view
        out = self.scratch.rows(S * L // self.unit, units)
        # index_select copies whole rows; advanced indexing (pool[rows]) was 2x slower here
        return torch.index_select(units, 0, self.index, out=out).view(S, L, -1)


@dataclass
class BatchLayout:
    """``prefills`` and ``decodes`` attend one sequence at a time; the members of ``groups`` together."""

    positions: torch.Tensor  # [N]
    write_rows: torch.Tensor  # [N] pool row of each token
    prefills: list[PrefillSegment]
    decodes: list[DecodeStep]
    decode_tokens: torch.Tensor  # [len(decodes)] rows of the flattened batch
    logit_rows: torch.Tensor  # rows of the batch whose next-token logits are wanted
    groups: list[GatherGroup]

    @classmethod
    def build(cls, segments: list[tuple[int, int, Extents]], logit_rows: list[int],
              device: torch.device, gather: bool = True, scratch: GatherScratch | None = None,
              block_size: int = 1) -> BatchLayout:
        """``segments``: (start position, n tokens, pool rows of positions 0 .. start + n) per sequence chunk.

        ``gather=False``: every sequence attends alone, over its rows in place (no groups);
        ``scratch`` holds the groups' gathered rows (a caller building many layouts keeps one);
        ``block_size``: the pool's, so groups gather whole blocks."""
        positions, write_rows, prefill_runs, decodes = [], [], [], []
        offset = 0
        for start, n, extents in segments:
            positions.append(torch.arange(start, start + n))
            write_rows.append(_rows_of(extents, start, start + n))
            (decodes if n == 1 else prefill_runs).append(Run(offset, n, start, extents))
            offset += n
        groups = []
        if gather:
            prefill_runs = _group(prefill_runs, lambda r: r.n <= MAX_GROUPED_PREFILL, groups, device, scratch,
                                  block_size)
            decodes = _group(decodes, lambda r: r.rows <= MAX_GROUPED_DECODE_ROWS, groups, device, scratch,
                             block_size)
        prefills = [PrefillSegment(slice(first, first + n), start, _clip(extents, start))
                    for first, n, start, extents in prefill_runs]
        decodes = [DecodeStep(first, extents) for first, _, _, extents in decodes]
        return cls(torch.cat(positions).to(device), torch.cat(write_rows).to(device), prefills, decodes,
                   torch.tensor([d.token for d in decodes], dtype=torch.long, device=device),
                   torch.tensor(logit_rows, dtype=torch.long, device=device), groups)


def _group(runs: list[Run], eligible, groups: list[GatherGroup], device, scratch, block_size: int) -> list[Run]:
    """Form groups of the ``eligible`` runs (appended to ``groups``); -> the runs left alone."""
    alone = [r for r in runs if not eligible(r)]
    for bucket in _buckets([r for r in runs if eligible(r)]):
        group = GatherGroup.build(bucket, device, scratch, block_size)
        if group is None:
            alone.extend(bucket)
        else:
            groups.append(group)
    return sorted(alone)


def _buckets(runs: list[Run]) -> list[list[Run]]:
    """``runs`` split into groups of similar size, largest first, so that padding stays within
    :data:`MAX_GROUP_PADDING` of each group's own work."""
    buckets: list[list[Run]] = []
    for run in sorted(runs, key=lambda r: r.work, reverse=True):
        if buckets:
            bucket = [*buckets[-1], run]
            padded = len(bucket) * max(r.n for r in bucket) * max(r.rows for r in bucket)
            if padded <= MAX_GROUP_PADDING * sum(r.work for r in bucket):
                buckets[-1] = bucket
                continue
        buckets.append([run])
    return buckets


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


def _whole_blocks(extents: Extents, block_size: int) -> bool:
    """Every run starts a block, and all but the last are whole blocks (positions map to blocks in order)."""
    return all(row % block_size == 0 and (n % block_size == 0 or i == len(extents) - 1)
               for i, (row, n) in enumerate(extents))


def _blocks_of(extents: Extents, block_size: int) -> torch.Tensor:
    """The pool blocks holding the rows of ``extents``, in order (see :func:`_whole_blocks`).

    Built as Python ints: a table grown beside others is a run per block, and an arange per run
    cost ~1.6 ms per step of 16 decoding sequences."""
    return torch.tensor([b for row, n in extents
                         for b in range(row // block_size, (row + n - 1) // block_size + 1)], dtype=torch.long)


def _rows_of(extents: Extents, start: int, end: int) -> torch.Tensor:
    """Pool row of each position in ``[start, end)``."""
    pieces, seen = [], 0
    for row, n in extents:
        lo, hi = max(start, seen), min(end, seen + n)
        if lo < hi:
            pieces.append(torch.arange(row + lo - seen, row + hi - seen))
        seen += n
    return torch.cat(pieces)
