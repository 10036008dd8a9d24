"""leyline_vllm's layout probe and row moves on emulated vLLM cache layouts (torch only, any device).

Each emulated backend is a cache view plus the write its ``do_kv_cache_update`` would make
(tests/vllm_layouts.py): vLLM 0.32's CUDA layouts (one shared buffer, per-layer ``as_strided``
views, token-major ``LBNHC`` by default and the other declared orders, several KV heads; MLA rows),
the CPU backend's head-major blocks, a VNNI-style prepacked layout, and layouts the probe must
refuse. Every test runs on the CPU and, where CUDA is present (``make gpu-check``), on the GPU.
"""

from __future__ import annotations

import os
import weakref

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from leyline_kernels import delta_rotation_table
from leyline_vllm.kv.layout import ContiguousRows, MappedRows, SpliceLayout, rows_for
from leyline_vllm.kv.probe import probe_row_map
from leyline_vllm.kv.rope import RopeSpec, UnsupportedModel
from vllm_layouts import KV_CACHE_LAYOUTS, cpu_writer, flash_writer, mla_writer, shared_cache

BLOCKS, SLOTS, HEADS, DIM = 8, 4, 2, 8
RANK, ROPE = 16, 8  # a small MLA row: c_kv 16 | k_pe 8
LAYERS = 3
PROBE_BOUND = 64 * 2**20  # bytes a probe may add, whatever the pool's size

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason="needs CUDA"))]


def vnni_packed(device, dtype):
    """K and V as [blocks, heads, 2, dim / 2, slots, 2]: each pair of dims of one slot side by side."""
    cache = torch.zeros(BLOCKS, HEADS, 2, DIM // 2, SLOTS, 2, dtype=dtype, device=device)

    def write(rows, slots):
        b, o = slots // SLOTS, slots % SLOTS
        for h in range(HEADS):
            cache[b, h, 0, :, o, :] = rows[:, h, :DIM].reshape(-1, DIM // 2, 2).to(dtype)
            cache[b, h, 1, :, o, :] = rows[:, h, DIM:].reshape(-1, DIM // 2, 2).to(dtype)
    return cache, write, "mapped"


def heads_layout(name: str, device: str, dtype=torch.float32, layer: int = 1):
    """(cache view, write, the row access the probe should pick) of one emulated backend."""
    if name == "cpu_head_major":
        cache = torch.zeros(BLOCKS, HEADS, SLOTS, 2 * DIM, dtype=dtype, device=device)
        return cache, cpu_writer(cache, DIM), "mapped"
    if name == "vnni_packed":
        return vnni_packed(device, dtype)
    shared = shared_cache(LAYERS, BLOCKS, HEADS, SLOTS, 2 * DIM, layout=name, dtype=dtype, device=device,
                          fill="zeros")
    view = shared.views[layer]
    # every declared order keeps a head's K | V (the content axis) innermost: whole rows
    return view, flash_writer(view, DIM), "contiguous"


HEAD_LAYOUTS = [*KV_CACHE_LAYOUTS, "cpu_head_major", "vnni_packed"]


def rope_spec(rotary_dim: int, pair_layout: str) -> RopeSpec:
    inv = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return RopeSpec(rotary_dim, pair_layout, inv, "test")


def heads_splice_layout(rotary_dim: int = DIM, pair_layout: str = "half_split") -> SpliceLayout:
    return SpliceLayout(rope_spec(rotary_dim, pair_layout), HEADS, 2 * DIM, 0, "heads")


def mla_splice_layout(pair_layout: str = "interleaved") -> SpliceLayout:
    return SpliceLayout(rope_spec(ROPE, pair_layout), 1, RANK + ROPE, RANK, "mla")


def probe(cache, write, lay: SpliceLayout, num_blocks: int = BLOCKS, block_size: int = SLOTS):
    return probe_row_map(cache, write, block_size=block_size, num_blocks=num_blocks,
                         rows_per_token=lay.rows_per_token, row_width=lay.row_width)


def rotate_reference(x: torch.Tensor, delta: int, spec: RopeSpec) -> torch.Tensor:
    """The rotary slice ``x [..., rotary_dim]`` rotated by ``delta`` positions in float64 (the exact answer)."""
    out = x.to(torch.float64).clone()
    angle = delta * spec.inv_freq.to(x.device)
    c, s = torch.cos(angle), torch.sin(angle)
    half = spec.rotary_dim // 2
    if spec.pair_layout == "half_split":
        first, second = torch.arange(half), torch.arange(half) + half
    else:
        first, second = torch.arange(0, spec.rotary_dim, 2), torch.arange(1, spec.rotary_dim, 2)
    x1, x2 = out[..., first].clone(), out[..., second].clone()
    out[..., first] = x1 * c - x2 * s
    out[..., second] = x2 * c + x1 * s
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", HEAD_LAYOUTS)
def test_probe_maps_every_element_and_puts_the_blocks_back(name, device):
    cache, write, access = heads_layout(name, device)
    lay = heads_splice_layout()
    cache.copy_(torch.randn(cache.shape))  # whatever the pool held before: the probe must leave it
    before = cache.clone()
    rows = rows_for(cache, probe(cache, write, lay), lay)
    assert torch.equal(cache, before)
    assert isinstance(rows, ContiguousRows if access == "contiguous" else MappedRows)
    key_value = torch.randn(5, HEADS, 2 * DIM, device=device)
    slots = torch.tensor([0, 3, 4, 17, BLOCKS * SLOTS - 1], device=device)
    write(key_value, slots)
    assert torch.equal(rows.gather(slots).view(5, HEADS, 2 * DIM), key_value)


@pytest.mark.parametrize("device", DEVICES)
def test_layers_of_one_shared_buffer_share_a_map_and_stay_apart(device):
    shared = shared_cache(LAYERS, BLOCKS, HEADS, SLOTS, 2 * DIM, dtype=torch.float32, device=device, fill="zeros")
    lay = heads_splice_layout()
    row_map = probe(shared.views[0], flash_writer(shared.views[0], DIM), lay)
    layers = [rows_for(view, row_map, lay) for view in shared.views]
    slots = torch.tensor([2, 9, 30], device=device)
    written = [torch.randn(3, HEADS, 2 * DIM, device=device) for _ in shared.views]
    for view, rows in zip(shared.views, written):
        flash_writer(view, DIM)(rows, slots)
    for rows, want in zip(layers, written):
        assert torch.equal(rows.gather(slots).view(3, HEADS, 2 * DIM), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["LBNHC", "LBHNC", "BLNHC", "cpu_head_major", "vnni_packed"])
@pytest.mark.parametrize("rotary_dim,pair_layout", [(DIM, "half_split"), (DIM, "interleaved"),
                                                    (DIM // 2, "half_split"), (DIM // 2, "interleaved")])
def test_splice_rotates_each_k_head_and_copies_v(name, rotary_dim, pair_layout, device):
    cache, write, _ = heads_layout(name, device)
    lay = heads_splice_layout(rotary_dim, pair_layout)
    rows = rows_for(cache, probe(cache, write, lay), lay)
    key, value = torch.randn(6, HEADS, DIM, device=device), torch.randn(6, HEADS, DIM, device=device)
    staged = torch.cat([key, value], dim=-1).reshape(6, -1)
    deltas = torch.tensor([5, 5, -3, 0, 1000, -7])
    delta_index, cos, sin = delta_rotation_table(deltas, lay.rope.inv_freq, device)
    slots = torch.tensor([1, 2, 9, 10, 22, 30], device=device)
    rows.splice(staged, slots, delta_index, cos, sin, pair_layout)
    got = rows.gather(slots).view(6, HEADS, 2 * DIM)
    for i, d in enumerate(deltas.tolist()):
        want = rotate_reference(key[i, :, :rotary_dim], d, lay.rope)
        assert torch.allclose(got[i, :, :rotary_dim].double(), want, atol=1e-5), (i, d)
    assert torch.equal(got[..., rotary_dim:DIM], key[..., rotary_dim:])  # non-rotary K dims: as they were
    assert torch.equal(got[..., DIM:], value)  # V: bit for bit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC"])
def test_mla_rows_are_probed_through_the_cache_write_and_rotated_in_place(layout, device):
    shared = shared_cache(LAYERS, BLOCKS, 1, SLOTS, RANK + ROPE, layout=layout, dtype=torch.float32, device=device,
                          mla=True)
    view = shared.views[2]
    lay = mla_splice_layout()
    write = mla_writer(view, RANK)
    rows = rows_for(view, probe(view, write, lay), lay)
    assert isinstance(rows, ContiguousRows)  # whole [c_kv | k_pe] rows, whatever the layers' order
    staged = torch.randn(4, RANK + ROPE, device=device)
    slots = torch.tensor([0, 5, 6, 31], device=device)
    delta_index, cos, sin = delta_rotation_table(torch.tensor([3, 3, -40, 7]), lay.rope.inv_freq, device)
    rows.splice(staged, slots, delta_index, cos, sin, "interleaved")
    got = view[slots // SLOTS, 0, slots % SLOTS]
    assert torch.equal(got[:, :RANK], staged[:, :RANK])  # c_kv copied bit for bit
    for i, d in enumerate([3, 3, -40, 7]):
        assert torch.allclose(got[i, RANK:].double(), rotate_reference(staged[i, RANK:], d, lay.rope), atol=1e-5)


def test_the_wrong_pairing_is_not_the_rotation():
    cache, write, _ = heads_layout("LBNHC", "cpu")
    lay = heads_splice_layout(DIM, "half_split")
    rows = rows_for(cache, probe(cache, write, lay), lay)
    key = torch.randn(1, HEADS, DIM)
    staged = torch.cat([key, torch.zeros_like(key)], dim=-1).reshape(1, -1)
    delta_index, cos, sin = delta_rotation_table(torch.tensor([40]), lay.rope.inv_freq)
    rows.splice(staged, torch.tensor([3]), delta_index, cos, sin, "interleaved")
    want = rotate_reference(key[0], 40, lay.rope)
    assert (rows.gather(torch.tensor([3])).view(HEADS, 2 * DIM)[:, :DIM].double() - want).abs().max() > 0.1


class AllocationMeter(TorchDispatchMode):
    """The peak of the bytes held by tensors created under it (new storages only: views and in-place
    results share their input's): the extra memory the code inside needs, on any device."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                nbytes = t.untyped_storage().nbytes()
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, nbytes)
        return out


def probe_extra_bytes(blocks: int, device: str, layout: str = "LBNHC", heads: int = 8, head_size: int = 128,
                      block_size: int = 16) -> tuple[int, int]:
    """(extra bytes the probe allocated, the pool's bytes) for a bf16 pool of ``blocks`` blocks of
    two layers (Llama-3-8B's 8 KV heads of 128)."""
    shared = shared_cache(2, blocks, heads, block_size, 2 * head_size, layout=layout, device=device)
    view = shared.views[1]
    lay = SpliceLayout(rope_spec(head_size, "half_split"), heads, 2 * head_size, 0, "heads")
    write = flash_writer(view, head_size)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        probe(view, write, lay, num_blocks=blocks, block_size=block_size)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - start
    else:
        with AllocationMeter() as meter:
            probe(view, write, lay, num_blocks=blocks, block_size=block_size)
        extra = meter.peak
    return extra, shared.buffer.numel() * shared.buffer.element_size()


@pytest.mark.parametrize("device", DEVICES)
def test_the_probe_needs_a_few_blocks_of_memory_whatever_the_pool(device, record_property):
    """A 4 GiB pool (the whole pool a scan would have copied on CUDA) and one 64 times smaller: the
    probe's extra memory is the same few blocks' worth, far under the bound."""
    big_blocks = 4 * 2**30 // (2 * 8 * 16 * 256 * 2)  # 4 GiB of bf16 rows over two layers
    extra_big, pool_big = probe_extra_bytes(big_blocks, device)
    extra_small, _ = probe_extra_bytes(big_blocks // 64, device)
    record_property("probe_pool_bytes", pool_big)
    record_property("probe_extra_bytes", extra_big)
    assert pool_big >= 4 * 2**30
    assert extra_big < PROBE_BOUND, extra_big
    assert extra_big == pytest.approx(extra_small, rel=0.05, abs=2**20)


def test_a_probe_that_fails_midway_puts_the_blocks_back():
    cache, write, _ = heads_layout("LBNHC", "cpu")
    cache.copy_(torch.randn(cache.shape))
    before = cache.clone()
    calls = []

    def breaks_on_the_third_write(rows, slots):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the backend's write failed")
        write(rows, slots)
    with pytest.raises(RuntimeError, match="write failed"):
        probe(cache, breaks_on_the_third_write, heads_splice_layout())
    assert torch.equal(cache, before)


def test_a_layout_that_does_not_repeat_per_block_is_refused():
    cache = torch.zeros(BLOCKS, SLOTS, HEADS, 2 * DIM)
    swap = {BLOCKS - 2: BLOCKS - 1, BLOCKS - 1: BLOCKS - 2}  # the last two blocks trade places

    def write(rows, slots):
        for i, s in enumerate(slots.tolist()):
            b, o = divmod(s, SLOTS)
            cache[swap.get(b, b), o] = rows[i]
    with pytest.raises(UnsupportedModel, match="repeat from block to block"):
        probe(cache, write, heads_splice_layout())


def test_a_write_that_lands_outside_the_probed_blocks_is_refused():
    cache = torch.zeros(BLOCKS, SLOTS, HEADS, 2 * DIM)

    def write(rows, slots):  # blocks are not the view's first dimension's blocks
        flat = cache.view(-1, HEADS, 2 * DIM)
        flat[(slots * 7) % flat.shape[0]] = rows
    with pytest.raises(UnsupportedModel, match="found"):
        probe(cache, write, heads_splice_layout())


def test_a_write_that_drops_elements_is_refused():
    cache, write, _ = heads_layout("LBNHC", "cpu")

    def lossy(rows, slots):
        rows = rows.clone()
        rows[..., -1] = 0  # the last dim of V is never stored
        write(rows, slots)
    with pytest.raises(UnsupportedModel, match="found"):
        probe(cache, lossy, heads_splice_layout())


def test_quantized_caches_and_views_without_a_block_dimension_are_refused():
    cache, write, _ = heads_layout("LBNHC", "cpu")
    with pytest.raises(UnsupportedModel, match="quantized"):
        probe(cache.to(torch.uint8), write, heads_splice_layout())
    with pytest.raises(UnsupportedModel, match="counts its"):
        probe(torch.zeros(BLOCKS * SLOTS * HEADS * 2 * DIM), write, heads_splice_layout())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_codes_are_exact(dtype):
    """The probe's codes survive a 16-bit cache (at most 128 per digit)."""
    cache, write, _ = heads_layout("LBHNC", "cpu", dtype)
    row_map = probe(cache, write, heads_splice_layout())
    assert row_map.base.shape == (SLOTS, HEADS, 2 * DIM)
    assert torch.unique(row_map.base).numel() == row_map.base.numel()
