"""Reference (and CPU) implementation of rotate-and-splice in plain torch.

For every row ``i``: gather ``src_pool[src_rows[i]]``, rotate its rope slice
by the table row ``delta_index[i]`` in fp32, round to the pool dtype (RNE) and
write the row to ``dst_pool[dst_rows[i]]``.  Columns outside the rope slice are
copied bit for bit.  The rope slice's pair layout is a parameter (see
:data:`PAIR_LAYOUTS`): half-split (dim ``j`` pairs with ``j + rope_dim/2``, the
bundled runtime) or interleaved (dim ``2j`` pairs with ``2j + 1``, vLLM's
DeepSeek cache); pair ``j`` rotates by ``inv_freq[j]`` in both.
"""

from __future__ import annotations

import torch

from ._checks import check_rotate_and_splice_args, pair_columns

__all__ = ["rotate_and_splice_torch"]

#: rows processed per chunk: small enough that the gathered rows stay in cache (measured
#: 1.3x a plain chunked indexed copy at 16k rows x 6 layers; 65536-row chunks were 2x); bounds the temporaries to a few times
#: ``CHUNK_ROWS * row_width`` elements.
CHUNK_ROWS = 2048


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
) -> None:
    n = src_rows.numel()
    first, second = pair_columns(rope_offset, rope_dim, pair_layout)
    single = cos.shape[0] == 1
    # Buffers reused by every chunk: fresh allocations this size are page-faulted each time.
    m = min(n, chunk_rows)
    gathered = src_pool.new_empty(m, src_pool.shape[1])
    out1_buf, out2_buf, prod_buf = (torch.empty(m, rope_dim // 2, device=src_pool.device) for _ in range(3))
    for a in range(0, n, chunk_rows):
        b = min(n, a + chunk_rows)
        rows = torch.index_select(src_pool, 0, src_rows[a:b], out=gathered[: b - a])  # bitwise gather
        x1 = rows[:, first].to(torch.float32)
        x2 = rows[:, second].to(torch.float32)
        if single:  # one distinct delta: broadcast instead of gathering
            c, s = cos, sin
        else:
            k = delta_index[a:b]
            c = cos.index_select(0, k)
            s = sin.index_select(0, k)
        out1, out2, prod = out1_buf[: b - a], out2_buf[: b - a], prod_buf[: b - a]
        # Each product is rounded to fp32 separately (no fused multiply-add),
        # the same arithmetic the Triton kernel performs.
        torch.mul(x1, c, out=out1)
        out1 -= torch.mul(x2, s, out=prod)
        torch.mul(x2, c, out=out2)
        out2 += torch.mul(x1, s, out=prod)
        # Both halves are computed before either is written back (for fp32
        # x1/x2 are views of ``rows``).  copy_ rounds fp32 -> bf16/fp16 RNE.
        rows[:, first] = out1
        rows[:, second] = out2
        dst_pool.index_copy_(0, dst_rows[a:b], rows)


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
