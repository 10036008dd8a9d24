"""Where a token's K rows sit in vLLM's paged cache, and how the connector reads and writes them.

The connector stores and moves a session's KV as *rows*: per token ``R`` rows
of ``W`` values with one rotary slice ``[rope_offset, rope_offset + rotary_dim)``
per row, rotated by ``leyline_kernels.rotate_and_splice``:

* **MLA** (DeepSeek-V2/V3, Kimi K2): one row per token, the cache row itself
  ``[c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]``; the rope slice is ``k_pe``.
  Written straight into the cache's ``[slots, width]`` view.
* **Standard attention** (GQA/MHA: Llama, Qwen, Mistral, GLM...): one row per
  KV head, ``[K (head_size) | V (head_size)]``; the rope slice is the first
  ``rotary_dim`` dims of K (partial rotary included), V is copied as it is.
  Backends lay K and V out differently (CUDA FlashAttention ``[2, blocks,
  slots, heads, dim]``; the CPU backend head-major blocks, prepacked for AMX
  tiles), so the layout is not assumed: at start :func:`probe_head_map` writes
  coded keys and values into three free blocks with the backend's own cache
  write (``impl.do_kv_cache_update``), finds every element, checks that the
  layout repeats from block to block, and zeroes them again. Rows are then
  gathered and scattered element by element through that map.

Anything the probe or the rotary check cannot vouch for raises
:class:`~leyline_vllm.rope.UnsupportedModel` with the reason: the connector
then serves the model with every directive applied as ``forget``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leyline_kernels import rotate_and_splice

from .rope import RopeSpec, UnsupportedModel

__all__ = ["HeadMap", "HeadRows", "LayerRows", "MlaRows", "SpliceLayout", "UnsupportedModel", "layer_rows",
           "probe_head_map"]


@dataclass
class SpliceLayout:
    """What every attention layer of the model shares: row shape and rotation."""

    rope: RopeSpec
    rows_per_token: int  # 1 (MLA) or the KV heads
    row_width: int  # MLA: kv_lora_rank + rope dim; heads: 2 * head_size (K | V)
    rope_offset: int  # MLA: kv_lora_rank; heads: 0
    kind: str  # "mla" or "heads"

    @property
    def token_width(self) -> int:
        return self.rows_per_token * self.row_width


class MlaRows:
    """One MLA layer's cache as ``[slots, width]`` rows."""

    def __init__(self, cache: torch.Tensor, layout: SpliceLayout):
        self.rows = cache.view(-1, cache.shape[-1])
        self.layout = layout
        self.dtype, self.device = cache.dtype, cache.device

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        return self.rows.index_select(0, slots)

    def splice(self, staged: torch.Tensor, slots: torch.Tensor, delta_index, cos, sin, pairing: str) -> None:
        """Write ``staged`` ([tokens, width]) to ``slots``, its k_pe rotated by each token's table row."""
        lay = self.layout
        rotate_and_splice(staged, self.rows, torch.arange(staged.shape[0], device=staged.device), slots,
                          delta_index, cos, sin, lay.rope_offset, lay.rope.rotary_dim, pair_layout=pairing)


@dataclass
class HeadMap:
    """Element offsets of a standard attention layer's K and V, learned by :func:`probe_head_map`.

    ``base[o, h]`` holds the offsets of ``[K | V]`` of head ``h`` for in-block slot ``o`` of block 0;
    block ``b`` is ``base + b * block_stride``. Offsets count elements from the layer view's first one.
    """

    base: torch.Tensor  # int64 [block_size, heads, 2 * head_size]
    block_stride: int
    block_size: int
    extent: int  # elements from the first one the map can reach (all blocks)

    def index(self, slots: torch.Tensor) -> torch.Tensor:
        blocks, within = slots // self.block_size, slots % self.block_size
        return self.base.to(slots.device)[within] + (blocks * self.block_stride)[:, None, None]


class HeadRows:
    """One standard attention layer's cache as ``[slots, heads, K | V]`` rows, through a :class:`HeadMap`."""

    def __init__(self, cache: torch.Tensor, head_map: HeadMap, layout: SpliceLayout):
        self.flat = cache.as_strided((head_map.extent,), (1,), cache.storage_offset())
        self.map = head_map
        self.layout = layout
        self.dtype, self.device = cache.dtype, cache.device

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        index = self.map.index(slots)
        return self.flat[index.reshape(-1)].view(slots.numel(), self.layout.token_width)

    def splice(self, staged: torch.Tensor, slots: torch.Tensor, delta_index, cos, sin, pairing: str) -> None:
        """Write ``staged`` ([tokens, heads * 2 * head_size]) to ``slots``, each K head's rotary dims
        rotated by its token's table row (the same table row for every head of a token); ``pairing``
        is the layout's own (the tests' wrong-pairing control passes the other)."""
        lay = self.layout
        heads, width = lay.rows_per_token, lay.row_width
        src = staged.reshape(-1, width)
        rotated = torch.empty_like(src)
        rows = torch.arange(src.shape[0], device=src.device)
        rotate_and_splice(src, rotated, rows, rows, delta_index.repeat_interleave(heads), cos, sin,
                          lay.rope_offset, lay.rope.rotary_dim, pair_layout=pairing)
        self.flat[self.map.index(slots).reshape(-1)] = rotated.reshape(-1)


LayerRows = MlaRows | HeadRows


# -- the layout probe -------------------------------------------------------------------------

_CODE_RADIX = 128  # codes up to 128 are exact in bf16, fp16 and fp32


def probe_head_map(cache: torch.Tensor, write, *, block_size: int, num_blocks: int, heads: int,
                   head_size: int) -> HeadMap:
    """Learn where ``write`` (the backend's ``do_kv_cache_update(key, value, cache, slot_mapping)``)
    puts each element of K and V: three free blocks at the end of the cache are written with coded
    keys (positive) and values (negative), every element is found, the blocks are zeroed again."""
    if num_blocks < 4:
        raise UnsupportedModel("the KV cache has fewer than 4 blocks (layout probe)")
    if cache.is_floating_point() is False or cache.element_size() < 2:
        raise UnsupportedModel(f"KV cache dtype {cache.dtype} (quantized caches are not spliced)")
    if int(torch.count_nonzero(cache)) != 0:
        raise UnsupportedModel("the KV cache is not empty at start (layout probe)")
    first = num_blocks - 3
    n = 3 * block_size
    slots = torch.arange(first * block_size, first * block_size + n, device=cache.device)
    grid = torch.stack(torch.meshgrid(torch.arange(n), torch.arange(heads), torch.arange(head_size),
                                      indexing="ij"))  # [3, n, heads, head_size]: token, head, dim
    codes = [grid[0] % _CODE_RADIX, grid[0] // _CODE_RADIX, grid[1] % _CODE_RADIX, grid[1] // _CODE_RADIX,
             grid[2] % _CODE_RADIX, grid[2] // _CODE_RADIX]
    where, read = None, []
    try:
        for code in codes:
            k = (code + 1).to(cache.dtype).to(cache.device)
            write(k, -k, cache, slots)
            if where is None:
                where = torch.nonzero(cache)  # [elements, cache.dim()]
            read.append(cache[tuple(where.T)].to("cpu", torch.float64))
    finally:
        if where is not None:
            cache[tuple(where.T)] = 0
        else:
            cache.zero_()
    offsets = (where.cpu() * torch.tensor(cache.stride(), dtype=torch.int64)).sum(1)
    return _head_map(offsets, read, block_size=block_size, first=first, num_blocks=num_blocks,
                     heads=heads, head_size=head_size)


def _head_map(offsets: torch.Tensor, read: list[torch.Tensor], *, block_size: int, first: int,
              num_blocks: int, heads: int, head_size: int) -> HeadMap:
    n = 3 * block_size
    want = 2 * n * heads * head_size
    if offsets.numel() != want or any(bool((r == 0).any()) for r in read):
        raise UnsupportedModel(f"the layout probe found {offsets.numel()} of {want} K/V elements")
    is_value = read[0] < 0
    values = [r.abs().round().to(torch.int64) - 1 for r in read]
    token = values[0] + values[1] * _CODE_RADIX
    head = values[2] + values[3] * _CODE_RADIX
    dim = values[4] + values[5] * _CODE_RADIX + is_value.to(torch.int64) * head_size  # V after K
    rows = torch.full((n, heads, 2 * head_size), -1, dtype=torch.int64)
    ok = (token < n) & (head < heads) & (dim < 2 * head_size)
    if not bool(ok.all()):
        raise UnsupportedModel("the layout probe read codes it did not write")
    rows[token, head, dim] = offsets
    if bool((rows < 0).any()) or torch.unique(offsets).numel() != want:
        raise UnsupportedModel("the layout probe did not find every K/V element exactly once")
    steps = rows.view(3, block_size, heads, 2 * head_size).diff(dim=0)
    stride = int(steps.flatten()[0])
    if not bool((steps == stride).all()) or stride == 0:
        raise UnsupportedModel("the KV cache layout does not repeat from block to block")
    base = rows[:block_size] - first * stride
    if int(base.min()) < 0:
        raise UnsupportedModel("the KV cache layout runs backwards over blocks")
    extent = int(base.max()) + (num_blocks - 1) * stride + 1
    return HeadMap(base, stride, block_size, extent)


# -- the model's layers -----------------------------------------------------------------------

def layer_rows(vllm_config, kv_caches: dict[str, torch.Tensor], ropes: list, num_blocks: int
               ) -> tuple[SpliceLayout, dict[str, LayerRows]]:
    """The layout and per-layer row access of the model vLLM loaded (``ropes``: its rotary objects,
    ``num_blocks``: KV blocks per layer), or :class:`UnsupportedModel`."""
    from .rope import rope_spec

    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
    if cache_dtype not in ("auto", "bfloat16", "float16", "float32", "half", "float"):
        raise UnsupportedModel(f"quantized KV cache ({cache_dtype}): a rotated row would be requantized")
    context = vllm_config.compilation_config.static_forward_context
    layers = {}
    for name in kv_caches:
        layer = context.get(name)
        if layer is None or not hasattr(layer, "head_size"):
            raise UnsupportedModel(f"layer {name} ({type(layer).__name__}) is not an attention layer")
        window = getattr(layer, "sliding_window", None)
        if window:
            raise UnsupportedModel(f"sliding-window attention (layer {name}, window {window}): "
                                   "a moved row may fall out of the window")
        layers[name] = layer
    rope = rope_spec(ropes)
    if all(hasattr(layer, "kv_lora_rank") for layer in layers.values()):
        return _mla_rows(kv_caches, layers, rope)
    if any(hasattr(layer, "kv_lora_rank") for layer in layers.values()):
        raise UnsupportedModel("the model mixes MLA and standard attention layers")
    return _head_rows(vllm_config.cache_config.block_size, num_blocks, kv_caches, layers, rope)


def _mla_rows(kv_caches, layers, rope: RopeSpec):
    ranks = {(int(layer.kv_lora_rank), int(layer.qk_rope_head_dim)) for layer in layers.values()}
    if len(ranks) != 1:
        raise UnsupportedModel(f"MLA layers of different widths {sorted(ranks)}")
    (rank, rope_dim), = ranks
    if rope.rotary_dim != rope_dim:
        raise UnsupportedModel(f"MLA rope width {rope_dim} but the rotary embedding rotates {rope.rotary_dim}")
    layout = SpliceLayout(rope, 1, rank + rope_dim, rank, "mla")
    for name, cache in kv_caches.items():
        if cache.shape[-1] != layout.row_width:
            raise UnsupportedModel(f"{name}: MLA cache rows are {cache.shape[-1]} wide, expected {layout.row_width}")
    return layout, {name: MlaRows(cache, layout) for name, cache in kv_caches.items()}


def _head_rows(block_size: int, num_blocks: int, kv_caches, layers, rope: RopeSpec):
    shapes = {(int(layer.num_kv_heads), int(layer.head_size)) for layer in layers.values()}
    if len(shapes) != 1:
        raise UnsupportedModel(f"attention layers of different shapes (kv heads, head size) {sorted(shapes)}")
    (heads, head_size), = shapes
    if rope.rotary_dim > head_size:
        raise UnsupportedModel(f"rotary width {rope.rotary_dim} exceeds the head size {head_size}")
    layout = SpliceLayout(rope, heads, 2 * head_size, 0, "heads")
    maps: dict[tuple, HeadMap] = {}
    out = {}
    for name, cache in kv_caches.items():
        geometry = (tuple(cache.shape), tuple(cache.stride()), cache.dtype, cache.device)
        if geometry not in maps:
            layer = layers[name]

            def write(key, value, kv_cache, slots, layer=layer):
                layer.impl.do_kv_cache_update(layer, key, value, kv_cache, slots)

            maps[geometry] = probe_head_map(cache, write, block_size=block_size, num_blocks=num_blocks,
                                            heads=heads, head_size=head_size)
        out[name] = HeadRows(cache, maps[geometry], layout)
    return layout, out

