"""Argument validation shared by every rotate-and-splice entry point."""

from __future__ import annotations

import torch

SUPPORTED_POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: How the rope slice pairs its dims for rotation.  Pair ``j`` (rotated by
#: ``inv_freq[j]``) is dims ``(j, j + rope_dim/2)`` half-split (the bundled
#: runtime, HF "rotate_half") or ``(2j, 2j + 1)`` interleaved (vLLM's DeepSeek
#: cache, ``is_neox_style=False``).
PAIR_LAYOUTS = ("half_split", "interleaved")


def pair_columns(rope_offset: int, rope_dim: int, pair_layout: str) -> tuple[slice, slice]:
    """Column slices of the first and second member of every rope pair."""
    end = rope_offset + rope_dim
    if pair_layout == "interleaved":
        return slice(rope_offset, end, 2), slice(rope_offset + 1, end, 2)
    mid = rope_offset + rope_dim // 2
    return slice(rope_offset, mid), slice(mid, end)


def _is_int_tensor(t: object) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and not t.is_floating_point()
        and not t.is_complex()
        and t.dtype != torch.bool
    )


def check_rotate_and_splice_args(
    src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim,
    pair_layout: str = "half_split",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate the arguments; return ``(src_rows, dst_rows, delta_index)`` as
    contiguous int64 tensors on the pools' device.  Raises ``ValueError``."""
    for name, pool in (("src_pool", src_pool), ("dst_pool", dst_pool)):
        if not isinstance(pool, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(pool).__name__}")
        if pool.dim() != 2:
            raise ValueError(f"{name} must be 2-D [num_rows, row_width], got shape {tuple(pool.shape)}")
        if pool.dtype not in SUPPORTED_POOL_DTYPES:
            raise ValueError(f"{name} dtype must be float32, bfloat16 or float16, got {pool.dtype}")
    if src_pool.dtype != dst_pool.dtype:
        raise ValueError(f"src_pool and dst_pool dtypes differ: {src_pool.dtype} vs {dst_pool.dtype}")
    if src_pool.device != dst_pool.device:
        raise ValueError(f"src_pool and dst_pool devices differ: {src_pool.device} vs {dst_pool.device}")
    width = src_pool.shape[1]
    if dst_pool.shape[1] != width:
        raise ValueError(f"row widths differ: src_pool has {width}, dst_pool has {dst_pool.shape[1]}")
    same_pool = src_pool is dst_pool
    if not same_pool and src_pool.numel() and dst_pool.numel():
        if src_pool.untyped_storage().data_ptr() == dst_pool.untyped_storage().data_ptr():
            if (src_pool.data_ptr(), src_pool.shape, src_pool.stride()) != (
                dst_pool.data_ptr(), dst_pool.shape, dst_pool.stride()
            ):
                raise ValueError("src_pool and dst_pool share storage but are different views; pass the same tensor")
            same_pool = True

    for name, v in (("rope_offset", rope_offset), ("rope_dim", rope_dim)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {type(v).__name__}")
    if rope_offset < 0:
        raise ValueError(f"rope_offset must be >= 0, got {rope_offset}")
    if rope_dim <= 0 or rope_dim % 2:
        raise ValueError(f"rope_dim must be a positive even number, got {rope_dim}")
    if rope_offset + rope_dim > width:
        raise ValueError(f"rope_offset + rope_dim = {rope_offset + rope_dim} exceeds the row width {width}")
    if pair_layout not in PAIR_LAYOUTS:
        raise ValueError(f"pair_layout must be one of {PAIR_LAYOUTS}, got {pair_layout!r}")

    for name, idx in (("src_rows", src_rows), ("dst_rows", dst_rows), ("delta_index", delta_index)):
        if not _is_int_tensor(idx):
            raise ValueError(f"{name} must be an integer torch.Tensor")
        if idx.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(idx.shape)}")
    n = src_rows.numel()
    if dst_rows.numel() != n or delta_index.numel() != n:
        raise ValueError(
            f"lengths differ: src_rows={n}, dst_rows={dst_rows.numel()}, delta_index={delta_index.numel()}"
        )

    half = rope_dim // 2
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if t.dim() != 2 or t.shape[1] != half:
            raise ValueError(f"{name} must have shape [n_distinct, {half}], got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin shapes differ: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    if n and cos.shape[0] == 0:
        raise ValueError("cos/sin tables are empty but rows were given")

    dev = src_pool.device
    for name, t in (("src_rows", src_rows), ("dst_rows", dst_rows), ("delta_index", delta_index),
                    ("cos", cos), ("sin", sin)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but the pools are on {dev}")

    src_rows = src_rows.to(torch.int64).contiguous()
    dst_rows = dst_rows.to(torch.int64).contiguous()
    delta_index = delta_index.to(torch.int64).contiguous()
    _check_indices(src_rows, dst_rows, delta_index, src_pool.shape[0], dst_pool.shape[0], cos.shape[0], same_pool)
    return src_rows, dst_rows, delta_index


def _check_indices(src_rows, dst_rows, delta_index, src_len: int, dst_len: int, table_len: int,
                   same_pool: bool) -> None:
    """Every index in range, ``dst_rows`` without repeats, and (within one pool) ``src_rows`` and
    ``dst_rows`` disjoint. Each index tensor's extremes and the set counts are reduced on the
    indices' device and read back in one transfer: on a GPU every read synchronises and every small
    op costs a launch, and at 4k tokens these checks cost more than the kernel (H200, gpu-check)."""
    n = dst_rows.numel()
    if n == 0:
        return
    ranges = (("src_rows", src_rows, src_len), ("dst_rows", dst_rows, dst_len), ("delta_index", delta_index, table_len))
    values = [v for _, idx, _ in ranges for v in torch.aminmax(idx)]
    check_sets = n > 1 or same_pool
    if check_sets:
        values += _set_counts(src_rows, dst_rows, dst_len, same_pool)
    got = torch.stack(values).tolist()
    for k, (name, _, upper) in enumerate(ranges):
        lo, hi = got[2 * k], got[2 * k + 1]
        if lo < 0 or hi >= upper:
            raise ValueError(f"{name} out of range: values span [{lo}, {hi}], valid range is [0, {upper})")
    if check_sets:
        distinct, shared = got[6], got[7]
        if distinct != n:
            raise ValueError("dst_rows contains duplicates")
        if shared:
            raise ValueError("src_rows and dst_rows overlap within the same pool; the row sets must be disjoint")


def _set_counts(src_rows, dst_rows, num_rows: int, same_pool: bool) -> list[torch.Tensor]:
    """[distinct rows in ``dst_rows``, ``src_rows`` that are also in ``dst_rows`` (0 across two pools)]
    as 0-d int64 tensors. Read only when every index is in range (an out-of-range one is reported
    first); clamped so that the reads here stay legal either way."""
    n = dst_rows.numel()
    dst_rows = dst_rows.clamp(0, num_rows - 1)
    if num_rows <= 8 * n + (1 << 16):
        # a byte map over the pool: O(num_rows + n), no sort
        mark = torch.zeros(num_rows, dtype=torch.uint8, device=dst_rows.device)
        mark.index_fill_(0, dst_rows, 1)
        distinct = mark.sum(dtype=torch.int64)
        shared = (mark.index_select(0, src_rows.clamp(0, num_rows - 1)).sum(dtype=torch.int64) if same_pool
                  else distinct.new_zeros(()))
    else:
        d = torch.sort(dst_rows).values
        distinct = n - (d[1:] == d[:-1]).sum()
        if same_pool:
            pos = torch.searchsorted(d, src_rows).clamp_(max=n - 1)
            shared = (d[pos] == src_rows).sum()
        else:
            shared = distinct.new_zeros(())
    return [distinct, shared]
