"""Where a token's rows sit in vLLM's paged cache, and how the connector reads and writes them.

The connector stores and moves a session's KV as *rows*: per token ``R`` rows
of ``W`` values with one rotary slice ``[rope_offset, rope_offset + rotary_dim)``
per row, rotated by ``leyline_kernels.rotate_and_splice``:

* **MLA** (DeepSeek-V2/V3, Kimi K2): one row per token, ``[c_kv (kv_lora_rank) |
  k_pe (qk_rope_head_dim)]``; the rope slice is ``k_pe``.
* **Standard attention** (GQA/MHA: Llama, Qwen, Mistral, GLM...): one row per
  KV head, ``[K (head_size) | V (head_size)]``; the rope slice is the first
  ``rotary_dim`` dims of K (partial rotary included), V is copied as it is.

Where those rows are is not assumed for either: at registration
:func:`~leyline_vllm.kv.probe.probe_row_map` writes coded rows into three blocks
through the backend's own cache write (``impl.do_kv_cache_update``) and maps
every element. Where each row is one contiguous run (MLA caches; all of vLLM
0.32's CUDA layouts for standard attention, K and V side by side) rows are
moved in place by the kernel (:class:`ContiguousRows`); elsewhere (the CPU
backend's blocks of K rows then V rows, prepacked tiles) element by element
through the map (:class:`MappedRows`).

Anything the probe or the rotary check cannot vouch for raises
:class:`~leyline_vllm.kv.rope.UnsupportedModel` with the reason: the connector
then serves the model with every directive applied as ``forget``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leyline_kernels import rotate_and_splice

from .probe import RowMap, probe_row_map
from .rope import RopeSpec, UnsupportedModel

__all__ = ["ContiguousRows", "LayerRows", "MappedRows", "SpliceLayout", "UnsupportedModel", "layer_rows", "rows_for"]


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


class ContiguousRows:
    """One layer's cache as a ``[rows, width]`` matrix: the probe found every row to be one contiguous
    run (MLA caches; every layout vLLM 0.32's CUDA backends declare, K and V side by side), so rows
    are gathered whole and moved by ``rotate_and_splice`` straight in the cache."""

    def __init__(self, cache: torch.Tensor, row_map: RowMap, layout: SpliceLayout, starts: torch.Tensor):
        width = layout.row_width
        self.rows = cache.as_strided((row_map.extent // width, width), (width, 1), cache.storage_offset())
        self.starts = starts.to(cache.device)  # [block_size, rows_per_token]: row indices in block 0
        self.block_rows, self.block_size = row_map.block_stride // width, row_map.block_size
        self.layout = layout
        self.dtype, self.device = cache.dtype, cache.device

    def _row_ids(self, slots: torch.Tensor) -> torch.Tensor:
        blocks, within = slots // self.block_size, slots % self.block_size
        return (self.starts[within] + (blocks * self.block_rows)[:, None]).reshape(-1)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        return self.rows.index_select(0, self._row_ids(slots)).view(slots.numel(), self.layout.token_width)

    def splice(self, staged: torch.Tensor, slots: torch.Tensor, delta_index, cos, sin, pairing: str) -> None:
        """Write ``staged`` ([tokens, token_width]) to ``slots``, each row's rope slice rotated by its
        token's table row (every row of a token by the same one); ``pairing`` is the layout's own (the
        tests' wrong-pairing control passes the other)."""
        lay = self.layout
        src = staged.reshape(-1, lay.row_width)
        rotate_and_splice(src, self.rows, torch.arange(src.shape[0], device=src.device), self._row_ids(slots),
                          delta_index.repeat_interleave(lay.rows_per_token), cos, sin, lay.rope_offset,
                          lay.rope.rotary_dim, pair_layout=pairing)


class MappedRows:
    """One layer's cache as ``[slots, rows_per_token, width]`` rows gathered and scattered element
    by element through the probe's :class:`~leyline_vllm.kv.probe.RowMap` (any layout that repeats per
    block: the CPU backend's head-major blocks, prepacked tiles)."""

    def __init__(self, cache: torch.Tensor, row_map: RowMap, layout: SpliceLayout):
        self.flat = cache.as_strided((row_map.extent,), (1,), cache.storage_offset())
        self.map = row_map
        self.layout = layout
        self.dtype, self.device = cache.dtype, cache.device

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        index = self.map.index(slots)
        return self.flat[index.reshape(-1)].view(slots.numel(), self.layout.token_width)

    def splice(self, staged: torch.Tensor, slots: torch.Tensor, delta_index, cos, sin, pairing: str) -> None:
        """As :meth:`ContiguousRows.splice`: rotated into a staging buffer, then scattered."""
        lay = self.layout
        src = staged.reshape(-1, lay.row_width)
        rotated = torch.empty_like(src)
        rows = torch.arange(src.shape[0], device=src.device)
        rotate_and_splice(src, rotated, rows, rows, delta_index.repeat_interleave(lay.rows_per_token), cos, sin,
                          lay.rope_offset, lay.rope.rotary_dim, pair_layout=pairing)
        self.flat[self.map.index(slots).reshape(-1)] = rotated.reshape(-1)


LayerRows = ContiguousRows | MappedRows


def rows_for(cache: torch.Tensor, row_map: RowMap, layout: SpliceLayout) -> LayerRows:
    """The fastest row access the probed layout allows."""
    starts = row_map.row_starts()
    return MappedRows(cache, row_map, layout) if starts is None else ContiguousRows(cache, row_map, layout, starts)


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
    recurrent = sorted({type(context[n]).__name__ for n in kv_caches
                        if n in context and not hasattr(context[n], "head_size")})
    if recurrent:  # Qwen3-Next / Qwen3.5 (Gated DeltaNet), Mamba hybrids, short convolutions (LFM2)
        raise UnsupportedModel(f"hybrid attention/recurrent model ({', '.join(recurrent)} layers): a recurrent "
                               "state sums the whole history; it has no per-token row to move and rotate")
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
        return _mla_rows(vllm_config.cache_config.block_size, num_blocks, kv_caches, layers, rope)
    if any(hasattr(layer, "kv_lora_rank") for layer in layers.values()):
        raise UnsupportedModel("the model mixes MLA and standard attention layers")
    return _head_rows(vllm_config.cache_config.block_size, num_blocks, kv_caches, layers, rope)


def _mla_rows(block_size: int, num_blocks: int, kv_caches, layers, rope: RopeSpec):
    ranks = {(int(layer.kv_lora_rank), int(layer.qk_rope_head_dim)) for layer in layers.values()}
    if len(ranks) != 1:
        raise UnsupportedModel(f"MLA layers of different widths {sorted(ranks)}")
    (rank, rope_dim), = ranks
    if rope.rotary_dim != rope_dim:
        raise UnsupportedModel(f"MLA rope width {rope_dim} but the rotary embedding rotates {rope.rotary_dim}")
    layout = SpliceLayout(rope, 1, rank + rope_dim, rank, "mla")

    def writer(layer, cache):
        scale = getattr(layer, "_k_scale", None)
        scale = torch.ones((), device=cache.device) if scale is None else scale
        # CUDA (0.32) hands the connector [blocks, 1, slots, width] and binds the layer to it squeezed
        bound = cache.squeeze(1) if cache.dim() == 4 and cache.shape[1] == 1 else cache

        def write(rows, slots):  # rows [tokens, 1, rank + rope]: c_kv, then k_pe as the layer hands it
            layer.impl.do_kv_cache_update(rows[:, 0, :rank].contiguous(), rows[:, :, rank:].contiguous(), bound,
                                          slots, getattr(layer, "kv_cache_dtype", "auto"), scale)
        return write

    return layout, _probed_rows(block_size, num_blocks, kv_caches, layers, layout, writer)


def _head_rows(block_size: int, num_blocks: int, kv_caches, layers, rope: RopeSpec):
    shapes = {(int(layer.num_kv_heads), int(layer.head_size)) for layer in layers.values()}
    if len(shapes) != 1:
        raise UnsupportedModel(f"attention layers of different shapes (kv heads, head size) {sorted(shapes)}")
    (heads, head_size), = shapes
    if rope.rotary_dim > head_size:
        raise UnsupportedModel(f"rotary width {rope.rotary_dim} exceeds the head size {head_size}")
    layout = SpliceLayout(rope, heads, 2 * head_size, 0, "heads")

    def writer(layer, cache):
        def write(rows, slots):  # rows [tokens, heads, K | V]
            layer.impl.do_kv_cache_update(layer, rows[..., :head_size].contiguous(), rows[..., head_size:].contiguous(),
                                          cache, slots)
        return write

    return layout, _probed_rows(block_size, num_blocks, kv_caches, layers, layout, writer)


def _probed_rows(block_size: int, num_blocks: int, kv_caches, layers, layout: SpliceLayout, writer
                 ) -> dict[str, LayerRows]:
    """Each layer's rows, probing once per view geometry (layers of one shared buffer differ only in
    their offset, which the map counts from)."""
    maps: dict[tuple, RowMap] = {}
    out = {}
    for name, cache in kv_caches.items():
        geometry = (tuple(cache.shape), tuple(cache.stride()), cache.dtype, cache.device)
        if geometry not in maps:
            maps[geometry] = probe_row_map(cache, writer(layers[name], cache), block_size=block_size,
                                           num_blocks=num_blocks, rows_per_token=layout.rows_per_token,
                                           row_width=layout.row_width)
        out[name] = rows_for(cache, maps[geometry], layout)
    return out
