"""Triton implementation of rotate-and-splice (GPU, or CPU via the Triton
interpreter with ``TRITON_INTERPRET=1``).  Bit-identical to
:func:`kernels.rotate_and_splice_torch`.

``triton`` is imported only when the kernel is first launched, so importing
this module (and ``kernels``) works without triton installed.
"""

from __future__ import annotations

import os

import torch

from ._checks import check_rotate_and_splice_args

__all__ = ["rotate_and_splice_triton", "triton_available"]

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def triton_available() -> bool:
    """True when ``triton`` can be imported."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no")


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _block_rows(n: int, block_w: int, interpret: bool) -> int:
    if interpret:
        # The interpreter pays per program and per op, not per element: use
        # big tiles (512 rows, fewer when the row is very wide).
        rows = max(256, min(1024, (1 << 17) // block_w))
    else:
        # GPU: keep a tile around 8k elements (~64 registers/thread at 4 warps).
        rows = max(1, min(256, 8192 // block_w))
    return max(1, min(rows, _next_pow2(n)))


def _rotate_and_splice_triton_impl(
    src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim,
    block_rows: int | None = None, pair_layout: str = "half_split",
) -> None:
    from ._triton_impl import _rotate_and_splice_kernel  # lazy: imports triton

    n = src_rows.numel()
    width = src_pool.shape[1]
    half = rope_dim // 2
    # pair j = columns (rope_offset + j*pair_step, that + partner_gap)
    pair_step, partner_gap = (2, 1) if pair_layout == "interleaved" else (1, half)
    interpret = _interpreting()
    block_w = _next_pow2(width)
    block_h = _next_pow2(half)
    if block_rows is None:
        block_rows = _block_rows(n, block_w, interpret)
    elif block_rows <= 0 or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows must be a positive power of two, got {block_rows}")
    cos = cos.contiguous()
    sin = sin.contiguous()
    grid = ((n + block_rows - 1) // block_rows,)
    _rotate_and_splice_kernel[grid](
        src_pool, dst_pool,
        src_rows, dst_rows, delta_index,
        cos, sin,
        n, width,
        src_pool.stride(0), src_pool.stride(1), dst_pool.stride(0), dst_pool.stride(1), cos.stride(0),
        rope_offset, half, pair_step, partner_gap,
        DTYPE=_DTYPE_CODE[src_pool.dtype],
        BLOCK_ROWS=block_rows,
        BLOCK_W=block_w,
        BLOCK_H=block_h,
        num_warps=4,
        # separate roundings for x1*c and x2*s, as in the torch reference
        enable_fp_fusion=False,
    )


def rotate_and_splice_triton(
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
    """Same contract as :func:`kernels.rotate_and_splice_torch`, run by a Triton
    kernel (1-D grid, ``BLOCK_ROWS`` rows x the padded row width per program)."""
    src_rows, dst_rows, delta_index = check_rotate_and_splice_args(
        src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim, pair_layout
    )
    if src_rows.numel() == 0:
        return
    if not triton_available():
        raise RuntimeError("rotate_and_splice_triton needs the 'triton' package, which is not importable")
    if src_pool.device.type == "cpu" and not _interpreting():
        raise RuntimeError(
            "rotate_and_splice_triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    _rotate_and_splice_triton_impl(
        src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim,
        pair_layout=pair_layout,
    )
