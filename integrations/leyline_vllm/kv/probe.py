"""The layout probe: where a backend's own cache write puts each element of a token's rows.

A token's cache rows are ``rows_per_token`` rows of ``row_width`` values (MLA: one row
``[c_kv | k_pe]``; standard attention: one ``[K | V]`` row per KV head). Backends lay them out
differently (vLLM 0.32's CUDA backends: per layer a ``[blocks, heads, slots, K|V]`` view of one
shared buffer, token-major underneath; the CPU backend: head-major blocks, K rows then V rows;
MLA: ``[blocks, slots, width]``), so nothing is assumed: :func:`probe_row_map` writes coded rows
into the last three blocks with the backend's cache write, finds each element, checks that the
layout repeats from block to block, and puts the three blocks back as they were.

It touches only those three blocks: the dimension of the cache view that counts blocks is sliced
to them before anything is read, so the extra memory is a few blocks' worth whatever the pool's
size (on a GPU vLLM has given most of its memory to the pool before the connector registers, and
a scan of a whole layer view, which CUDA makes contiguous first, could run it out of memory).
Every way the probe can fail raises :class:`~leyline_vllm.kv.rope.UnsupportedModel` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .rope import UnsupportedModel

# Codes up to 128 are exact in bf16, fp16 and fp32; each field is written as two base-128 digits.
_CODE_RADIX = 128
_DIGITS = ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1))  # (field, digit): token, row and element, 2 digits each
PROBED_BLOCKS = 3  # two block steps: the second checks that the first repeats

RowWriter = Callable[[torch.Tensor, torch.Tensor], None]  # (rows [tokens, rows_per_token, width], slots)


@dataclass
class RowMap:
    """Element offsets of a layer's token rows, learned by :func:`probe_row_map`.

    ``base[o, r, w]`` is the offset of element ``w`` of row ``r`` of in-block slot ``o`` of block 0;
    block ``b`` is ``base + b * block_stride``. Offsets count elements from the layer view's first one.
    """

    base: torch.Tensor  # int64 [block_size, rows_per_token, row_width]
    block_stride: int
    block_size: int
    extent: int  # elements from the first one the map can reach (all blocks)

    def index(self, slots: torch.Tensor) -> torch.Tensor:
        blocks, within = slots // self.block_size, slots % self.block_size
        return self.base.to(slots.device)[within] + (blocks * self.block_stride)[:, None, None]

    def row_starts(self) -> torch.Tensor | None:
        """Where every row is one contiguous run of ``row_width`` elements at a multiple of it (the
        cache is then a ``[rows, row_width]`` matrix): each row's index in that matrix for block 0,
        ``[block_size, rows_per_token]`` (block ``b`` adds ``b * block_stride / row_width``); else None."""
        width = self.base.shape[-1]
        starts = self.base[..., 0]
        runs = torch.equal(self.base - starts[..., None], torch.arange(width).expand_as(self.base))
        if not runs or self.block_stride % width or bool((starts % width).any()):
            return None
        return starts // width


def block_dim(cache: torch.Tensor, num_blocks: int) -> int:
    """The dimension of the cache view that counts blocks (the outermost one, if several could)."""
    dims = [d for d in range(cache.dim()) if cache.shape[d] == num_blocks]
    if not dims:
        raise UnsupportedModel(f"no dimension of the KV cache view {tuple(cache.shape)} counts its "
                               f"{num_blocks} blocks (layout probe)")
    return max(dims, key=lambda d: cache.stride(d))


def probe_row_map(cache: torch.Tensor, write: RowWriter, *, block_size: int, num_blocks: int,
                  rows_per_token: int, row_width: int) -> RowMap:
    """Learn where ``write`` puts each element of a token's rows: see the module's docstring."""
    if num_blocks < PROBED_BLOCKS + 1:
        raise UnsupportedModel(f"the KV cache has fewer than {PROBED_BLOCKS + 1} blocks (layout probe)")
    if not cache.is_floating_point() or cache.element_size() < 2:
        raise UnsupportedModel(f"KV cache dtype {cache.dtype} (quantized caches are not spliced)")
    first = num_blocks - PROBED_BLOCKS
    dim = block_dim(cache, num_blocks)
    blocks = [cache.narrow(dim, first + i, 1) for i in range(PROBED_BLOCKS)]
    saved = [b.clone() for b in blocks]
    n = PROBED_BLOCKS * block_size
    slots = torch.arange(first * block_size, first * block_size + n, device=cache.device)
    fields = [torch.arange(size, dtype=torch.int32, device=cache.device).view(view)
              for size, view in ((n, (n, 1, 1)), (rows_per_token, (1, rows_per_token, 1)),
                                 (row_width, (1, 1, row_width)))]  # token, row, element
    shape = (n, rows_per_token, row_width)
    found: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    try:
        for block in blocks:
            block.zero_()
        reads: list[list[torch.Tensor]] = [[] for _ in blocks]
        where: list[torch.Tensor | None] = [None] * len(blocks)
        for field, digit in _DIGITS:
            code = (fields[field] // _CODE_RADIX ** digit % _CODE_RADIX + 1).expand(shape)
            write(code.to(cache.dtype), slots)
            del code
            for i, block in enumerate(blocks):
                if where[i] is None:
                    where[i] = block != 0
                reads[i].append(block[where[i]].to(torch.uint8).cpu())  # a digit + 1: 1..128
        for i, block in enumerate(blocks):
            found.append((_offsets(block, cache)[where[i]].cpu(), reads[i]))
    finally:
        for block, original in zip(blocks, saved):
            block.copy_(original)
    offsets = torch.cat([o for o, _ in found])
    read = [torch.cat([r[k] for _, r in found]) for k in range(len(_DIGITS))]
    return _row_map(offsets, read, block_size=block_size, first=first, num_blocks=num_blocks,
                    rows_per_token=rows_per_token, row_width=row_width)


def _offsets(view: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Each element's offset from ``cache``'s first element, shaped like ``view`` (int64)."""
    out = torch.full(view.shape, view.storage_offset() - cache.storage_offset(), dtype=torch.int64,
                     device=view.device)
    for d, (size, stride) in enumerate(zip(view.shape, view.stride())):
        shape = [1] * view.dim()
        shape[d] = size
        out += (torch.arange(size, device=view.device) * stride).view(shape)
    return out


def _row_map(offsets: torch.Tensor, read: list[torch.Tensor], *, block_size: int, first: int, num_blocks: int,
             rows_per_token: int, row_width: int) -> RowMap:
    n = PROBED_BLOCKS * block_size
    want = n * rows_per_token * row_width
    if offsets.numel() != want or any(bool((r <= 0).any()) for r in read):
        raise UnsupportedModel(f"the layout probe found {offsets.numel()} of {want} row elements in the "
                               "probed blocks")

    def field(k: int) -> torch.Tensor:  # two uint8 reads (a digit + 1 each) back to the int32 field
        return (read[2 * k].to(torch.int32) - 1) + (read[2 * k + 1].to(torch.int32) - 1) * _CODE_RADIX

    token, row, col = field(0), field(1), field(2)
    if not bool(((token < n) & (row < rows_per_token) & (col < row_width)).all()):
        raise UnsupportedModel("the layout probe read codes it did not write")
    rows = torch.full((n, rows_per_token, row_width), -1, dtype=torch.int64)
    rows[token, row, col] = offsets
    if bool((rows < 0).any()) or torch.unique(offsets).numel() != want:
        raise UnsupportedModel("the layout probe did not find every row element exactly once")
    steps = rows.view(PROBED_BLOCKS, block_size, rows_per_token, row_width).diff(dim=0)
    stride = int(steps.flatten()[0])
    if not bool((steps == stride).all()) or stride == 0:
        raise UnsupportedModel("the KV cache layout does not repeat from block to block")
    base = rows[:block_size] - first * stride
    if int(base.min()) < 0:
        raise UnsupportedModel("the KV cache layout runs backwards over blocks")
    extent = int(base.max()) + (num_blocks - 1) * stride + 1
    return RowMap(base, stride, block_size, extent)
