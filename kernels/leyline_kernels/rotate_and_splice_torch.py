"""Reference (and CPU) implementation of rotate-and-splice in plain torch.

For every row ``i``: gather ``src_pool[src_rows[i]]``, rotate its rope slice
by the table row ``delta_index[i]`` in fp32, round to the pool dtype (RNE) and
write the row to ``dst_pool[dst_rows[i]]``.  Columns outside the rope slice are
copied bit for bit.  The rope slice's pair layout is a parameter (see
:data:`PAIR_LAYOUTS`): half-split (dim ``j`` pairs with ``j + rope_dim/2``, the
bundled runtime) or interleaved (dim ``2j`` pairs with ``2j + 1``, vLLM's
DeepSeek cache); pair ``j`` rotates by ``inv_freq[j]`` in both.

Rows move two ways, with the same arithmetic: runs of at least
:data:`MIN_RUN_ROWS` rows that are consecutive in both pools and share one
delta (an edit moves a session's tail as one run per layer when its blocks
sit next to each other) are copied slice to slice and rotated in place at the
destination by one broadcast cos/sin row; every other row is gathered,
rotated and scattered by index.
"""

from __future__ import annotations

import torch

from ._checks import check_rotate_and_splice_args, pair_columns

__all__ = ["rotate_and_splice_torch"]

#: rows processed per chunk: small enough that the chunk stays in cache between its copy and
#: its rotation (65536-row chunks were 2x slower at 16k rows x 6 layers); bounds the
#: temporaries to a few times ``CHUNK_ROWS * row_width`` elements.
CHUNK_ROWS = 2048
#: a run of consecutive rows at least this long is copied as a slice (a memcpy, about twice
#: the speed of an indexed copy); shorter runs would cost more in per-call overhead.
MIN_RUN_ROWS = 256


class _Rotator:
    """Rotates the rope slice of row blocks in place, reusing its fp32 buffers."""

    def __init__(self, rows: int, rope_offset: int, rope_dim: int, pair_layout: str,
                 cos: torch.Tensor, sin: torch.Tensor, device):
        self.first, self.second = pair_columns(rope_offset, rope_dim, pair_layout)
        self.cos, self.sin = cos, sin
        # Reused by every chunk: fresh allocations this size are page-faulted each time.
        self.out1, self.out2, self.prod = (torch.empty(rows, rope_dim // 2, device=device) for _ in range(3))

    def __call__(self, rows: torch.Tensor, table_rows: torch.Tensor | int) -> None:
        """Rotate ``rows`` (``[m, width]``) by the table row of each (``[m]``), or by one
        table row for all of them (an int: broadcast instead of gathering)."""
        m = rows.shape[0]
        x1 = rows[:, self.first].to(torch.float32)
        x2 = rows[:, self.second].to(torch.float32)
        if isinstance(table_rows, int):
            c, s = self.cos[table_rows: table_rows + 1], self.sin[table_rows: table_rows + 1]
        else:
            c, s = self.cos.index_select(0, table_rows), self.sin.index_select(0, table_rows)
        out1, out2, prod = self.out1[:m], self.out2[:m], self.prod[:m]
        # Each product is rounded to fp32 separately (no fused multiply-add),
        # the same arithmetic the Triton kernel performs.
        torch.mul(x1, c, out=out1)
        out1 -= torch.mul(x2, s, out=prod)
        torch.mul(x2, c, out=out2)
        out2 += torch.mul(x1, s, out=prod)
        # Both halves are computed before either is written back (for fp32
        # x1/x2 are views of ``rows``).  copy_ rounds fp32 -> bf16/fp16 RNE.
        rows[:, self.first] = out1
        rows[:, self.second] = out2


def _runs(src_rows: torch.Tensor, dst_rows: torch.Tensor, delta_index: torch.Tensor,
          min_run: int) -> tuple[list[list[int]], torch.Tensor | None]:
    """Runs of at least ``min_run`` rows consecutive in both pools and moved by one delta,
    each as ``[first src row, first dst row, length, table row]``, and the indices of the
    rows outside those runs (``None``: there is no run, so every row)."""
    n = src_rows.numel()
    steps = (((src_rows[1:] - src_rows[:-1]) == 1) & ((dst_rows[1:] - dst_rows[:-1]) == 1)
             & (delta_index[1:] == delta_index[:-1]))
    starts = torch.cat((steps.new_zeros(1, dtype=torch.long), (~steps).nonzero().flatten() + 1))
    lengths = torch.diff(starts, append=starts.new_full((1,), n))
    long = lengths >= min_run
    if not bool(long.any()):
        return [], None
    first = starts[long]
    runs = torch.stack((src_rows[first], dst_rows[first], lengths[long], delta_index[first]), dim=1).tolist()
    outside = src_rows.new_ones(n, dtype=torch.bool)
    for start, length in torch.stack((first, lengths[long]), dim=1).tolist():
        outside[start: start + length] = False
    return runs, outside.nonzero().flatten()


def _one_table_row(table_rows: torch.Tensor) -> torch.Tensor | int:
    """``table_rows``, or the one row they all name (rotated by broadcast, no gather)."""
    lo, hi = torch.aminmax(table_rows)
    return int(lo) if int(lo) == int(hi) else table_rows


def _rotate_and_splice_torch_impl(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
    delta_index: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_offset: int,
    rope_dim: int,
    chunk_rows: int = CHUNK_ROWS,
    pair_layout: str = "half_split",
    min_run: int = MIN_RUN_ROWS,
) -> None:
    n = src_rows.numel()
    rotate = _Rotator(min(n, chunk_rows), rope_offset, rope_dim, pair_layout, cos, sin, src_pool.device)
    runs, rest = _runs(src_rows, dst_rows, delta_index, min_run)
    for src, dst, length, table_row in runs:
        # Copy a chunk slice to slice (a memcpy), then rotate it where it landed, still in cache.
        for a in range(0, length, chunk_rows):
            m = min(chunk_rows, length - a)
            rows = dst_pool[dst + a: dst + a + m]
            rows.copy_(src_pool[src + a: src + a + m])
            rotate(rows, table_row)
    left = n if rest is None else len(rest)
    if not left:
        return
    gathered = src_pool.new_empty(min(left, chunk_rows), src_pool.shape[1])
    for a in range(0, left, chunk_rows):
        index = slice(a, a + chunk_rows) if rest is None else rest[a: a + chunk_rows]
        rows = torch.index_select(src_pool, 0, src_rows[index], out=gathered[: min(chunk_rows, left - a)])
        rotate(rows, _one_table_row(delta_index[index]))
        dst_pool.index_copy_(0, dst_rows[index], rows)


def rotate_and_splice_torch(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
    delta_index: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_offset: int,
    rope_dim: int,
    pair_layout: str = "half_split",
) -> None:
    """Copy rows ``src_pool[src_rows]`` to ``dst_pool[dst_rows]``, rotating the
    rope slice ``[rope_offset, rope_offset + rope_dim)`` of row ``i`` by the
    angles of table row ``delta_index[i]`` (``cos``/``sin`` from
    :func:`kernels.delta_rotation_table`).  ``src_pool`` and ``dst_pool`` may be
    the same tensor; the source and destination row sets must be disjoint.
    ``pair_layout`` is ``"half_split"`` (default) or ``"interleaved"``."""
    src_rows, dst_rows, delta_index = check_rotate_and_splice_args(
        src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim, pair_layout
    )
    if src_rows.numel() == 0:
        return
    _rotate_and_splice_torch_impl(
        src_pool, dst_pool, src_rows, dst_rows, delta_index,
        cos.contiguous(), sin.contiguous(), rope_offset, rope_dim, pair_layout=pair_layout,
    )
