"""The Triton kernel behind :func:`kernels.rotate_and_splice_triton`.

Imported lazily (it imports triton at module level).  Set ``TRITON_INTERPRET=1``
before the first import to run it on CPU through the Triton interpreter.

Each program handles ``BLOCK_ROWS`` rows.  The position-free columns are
moved as raw values (never converted), the rope slice is rotated in fp32 and
rounded to the pool dtype with round-to-nearest-even:

* bf16 is widened and narrowed with integer bit operations -- exact on every
  backend, and independent of the interpreter, whose fp32 -> bf16 cast
  truncates and whose bf16 <-> fp32 casts mishandle subnormals;
* fp16 uses the plain cast, which is RNE both in the interpreter (numpy
  ``astype``) and on GPU (``cvt.rn``).

The products are rounded separately (``x1*c - x2*s``); on GPU the kernel is
launched with ``enable_fp_fusion=False`` so no multiply-add gets fused, which
keeps the results bit-identical to the torch reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

# dtype codes (constexpr)
F32 = 0
BF16 = 1
F16 = 2


@triton.jit
def _bf16_bits_to_f32(v):
    # bf16 -> fp32 is "bits << 16"; sign-extend the int16 and shift, exact.
    b = v.to(tl.int16, bitcast=True).to(tl.int32)
    return (b << 16).to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_rne(x):
    u = x.to(tl.int32, bitcast=True)
    lsb = (u >> 16) & 1
    r = (u + (0x7FFF + lsb)) & -65536  # -65536 == 0xFFFF0000
    # NaN: keep it a quiet NaN with its sign (the addition could carry it into
    # another class); torch emits a quiet NaN as well.
    r = tl.where(x != x, (u & -65536) | 0x00400000, r)
    h = (r >> 16).to(tl.int16)
    return h.to(tl.bfloat16, bitcast=True)


@triton.jit
def _rotate_and_splice_kernel(
    src_ptr, dst_ptr,
    src_rows_ptr, dst_rows_ptr, didx_ptr,
    cos_ptr, sin_ptr,
    n_rows, width,
    src_stride_r, src_stride_c, dst_stride_r, dst_stride_c, tab_stride,
    rope_offset, half, pair_step, partner_gap,
    DTYPE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rmask = r < n_rows
    s_idx = tl.load(src_rows_ptr + r, mask=rmask, other=0).to(tl.int64)
    d_idx = tl.load(dst_rows_ptr + r, mask=rmask, other=0).to(tl.int64)
    k = tl.load(didx_ptr + r, mask=rmask, other=0).to(tl.int64)
    s_row = src_ptr + s_idx[:, None] * src_stride_r
    d_row = dst_ptr + d_idx[:, None] * dst_stride_r

    # 1) position-free columns: raw copy, the rope slice masked out.
    cols = tl.arange(0, BLOCK_W)
    in_rope = (cols >= rope_offset) & (cols < rope_offset + 2 * half)  # both pair layouts fill the slice
    cmask = rmask[:, None] & ((cols < width) & (in_rope == 0))[None, :]
    v = tl.load(s_row + cols[None, :] * src_stride_c, mask=cmask)
    tl.store(d_row + cols[None, :] * dst_stride_c, v, mask=cmask)

    # 2) rope slice, rotated in fp32: pair j is (j, j + half) half-split
    #    (pair_step 1, partner_gap half) or (2j, 2j + 1) interleaved (2, 1).
    j = tl.arange(0, BLOCK_H)
    hmask = rmask[:, None] & (j < half)[None, :]
    c1 = (rope_offset + j * pair_step)[None, :]
    c2 = c1 + partner_gap
    a1 = tl.load(s_row + c1 * src_stride_c, mask=hmask, other=0.0)
    a2 = tl.load(s_row + c2 * src_stride_c, mask=hmask, other=0.0)
    if DTYPE == 1:
        x1 = _bf16_bits_to_f32(a1)
        x2 = _bf16_bits_to_f32(a2)
    else:
        x1 = a1.to(tl.float32)
        x2 = a2.to(tl.float32)
    t = k[:, None] * tab_stride + j[None, :]
    c = tl.load(cos_ptr + t, mask=hmask, other=1.0)
    s = tl.load(sin_ptr + t, mask=hmask, other=0.0)
    p1 = x1 * c
    q1 = x2 * s
    o1 = p1 - q1
    p2 = x2 * c
    q2 = x1 * s
    o2 = p2 + q2
    if DTYPE == 1:
        y1 = _f32_to_bf16_rne(o1)
        y2 = _f32_to_bf16_rne(o2)
    elif DTYPE == 2:
        y1 = o1.to(tl.float16)
        y2 = o2.to(tl.float16)
    else:
        y1 = o1
        y2 = o2
    tl.store(d_row + c1 * dst_stride_c, y1, mask=hmask)
    tl.store(d_row + c2 * dst_stride_c, y2, mask=hmask)
