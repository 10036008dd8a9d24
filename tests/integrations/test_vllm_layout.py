"""leyline_vllm.layout: the layout probe and the per-head row moves, on emulated backend layouts (torch only).

Each emulated backend is a cache tensor plus the write function its ``do_kv_cache_update`` would be:
CUDA FlashAttention's ``[2, blocks, slots, heads, dim]``, the CPU backend's head-major blocks
(``[blocks, heads, 2 * slots, dim]``: K rows then V rows), a VNNI-style prepacked layout (pairs of dims
interleaved across slots, as AMX tiles want), and layouts the probe must refuse.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from leyline_kernels import delta_rotation_table
from leyline_vllm.layout import HeadRows, SpliceLayout, probe_head_map
from leyline_vllm.rope import RopeSpec, UnsupportedModel

BLOCKS, SLOTS, HEADS, DIM = 8, 4, 2, 8


def flash_layout():
    cache = torch.zeros(2, BLOCKS, SLOTS, HEADS, DIM)

    def write(key, value, kv, slots):
        kv[0, slots // SLOTS, slots % SLOTS] = key
        kv[1, slots // SLOTS, slots % SLOTS] = value
    return cache, write


def cpu_head_major_layout():
    cache = torch.zeros(BLOCKS, HEADS, SLOTS, 2 * DIM)

    def write(key, value, kv, slots):
        view = kv.view(BLOCKS, HEADS, 2 * SLOTS, DIM)
        b, o = slots // SLOTS, slots % SLOTS
        for h in range(HEADS):
            view[b, h, o] = key[:, h]
            view[b, h, SLOTS + o] = value[:, h]
    return cache, write


def vnni_packed_layout():
    """K as [blocks, heads, dim / 2, slots, 2]: each pair of dims of one slot side by side, slots inner."""
    cache = torch.zeros(BLOCKS, HEADS, 2, DIM // 2, SLOTS, 2)

    def write(key, value, kv, slots):
        b, o = slots // SLOTS, slots % SLOTS
        for h in range(HEADS):
            kv[b, h, 0, :, o, :] = key[:, h].reshape(-1, DIM // 2, 2)
            kv[b, h, 1, :, o, :] = value[:, h].reshape(-1, DIM // 2, 2)
    return cache, write


LAYOUTS = {"flash": flash_layout, "cpu_head_major": cpu_head_major_layout, "vnni_packed": vnni_packed_layout}


def probe(cache, write):
    return probe_head_map(cache, write, block_size=SLOTS, num_blocks=BLOCKS, heads=HEADS, head_size=DIM)


def rope_spec(rotary_dim: int, pair_layout: str) -> RopeSpec:
    inv = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return RopeSpec(rotary_dim, pair_layout, inv, "test")


def layout(rotary_dim: int = DIM, pair_layout: str = "half_split") -> SpliceLayout:
    return SpliceLayout(rope_spec(rotary_dim, pair_layout), HEADS, 2 * DIM, 0, "heads")


def rotate_reference(k: torch.Tensor, delta: int, spec: RopeSpec) -> torch.Tensor:
    """K heads ``[n, heads, dim]`` rotated by ``delta`` positions in float64 (the exact answer)."""
    out = k.to(torch.float64).clone()
    angle = delta * spec.inv_freq
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


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_probe_finds_every_element_and_leaves_the_cache_empty(name):
    cache, write = LAYOUTS[name]()
    head_map = probe(cache, write)
    assert int(torch.count_nonzero(cache)) == 0  # the probe's blocks are zero again
    rows = HeadRows(cache, head_map, layout())
    key, value = torch.randn(5, HEADS, DIM), torch.randn(5, HEADS, DIM)
    slots = torch.tensor([0, 3, 4, 17, BLOCKS * SLOTS - 1])
    write(key, value, cache, slots)
    got = rows.gather(slots).view(5, HEADS, 2 * DIM)
    assert torch.equal(got[..., :DIM], key) and torch.equal(got[..., DIM:], value)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("rotary_dim,pair_layout", [(DIM, "half_split"), (DIM, "interleaved"), (DIM // 2, "half_split"),
                                                    (DIM // 2, "interleaved")])
def test_splice_rotates_each_k_head_and_copies_v(name, rotary_dim, pair_layout):
    cache, write = LAYOUTS[name]()
    lay = layout(rotary_dim, pair_layout)
    rows = HeadRows(cache, probe(cache, write), lay)
    key, value = torch.randn(6, HEADS, DIM), torch.randn(6, HEADS, DIM)
    staged = torch.cat([key, value], dim=-1).reshape(6, -1)
    deltas = torch.tensor([5, 5, -3, 0, 1000, -7])
    delta_index, cos, sin = delta_rotation_table(deltas, lay.rope.inv_freq)
    slots = torch.tensor([1, 2, 9, 10, 22, 30])
    rows.splice(staged, slots, delta_index, cos, sin, pair_layout)
    got = rows.gather(slots).view(6, HEADS, 2 * DIM)
    for i, d in enumerate(deltas.tolist()):
        want = rotate_reference(key[i:i + 1], d, lay.rope)[0]
        assert torch.allclose(got[i, :, :DIM].double(), want, atol=1e-5), (i, d)
    assert torch.equal(got[..., rotary_dim:DIM], key[..., rotary_dim:])  # non-rotary K dims: as they were
    assert torch.equal(got[..., DIM:], value)  # V: bit for bit


def test_the_wrong_pairing_is_not_the_rotation():
    cache, write = flash_layout()
    lay = layout(DIM, "half_split")
    rows = HeadRows(cache, probe(cache, write), lay)
    key = torch.randn(1, HEADS, DIM)
    staged = torch.cat([key, torch.zeros_like(key)], dim=-1).reshape(1, -1)
    delta_index, cos, sin = delta_rotation_table(torch.tensor([40]), lay.rope.inv_freq)
    rows.splice(staged, torch.tensor([3]), delta_index, cos, sin, "interleaved")
    want = rotate_reference(key, 40, lay.rope)[0]
    assert (rows.gather(torch.tensor([3])).view(HEADS, 2 * DIM)[:, :DIM].double() - want).abs().max() > 0.1


def test_a_layout_that_does_not_repeat_per_block_is_refused():
    cache = torch.zeros(BLOCKS * SLOTS * HEADS * 2 * DIM)
    scramble = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(1))

    def write(key, value, kv, slots):  # blocks placed in a random order: no block stride
        for i, s in enumerate(slots.tolist()):
            b, o = divmod(s, SLOTS)
            at = ((int(scramble[b]) * SLOTS + o) * HEADS) * 2 * DIM
            kv[at: at + HEADS * 2 * DIM] = torch.cat([key[i], value[i]], dim=-1).reshape(-1)
    with pytest.raises(UnsupportedModel, match="repeat from block to block|backwards"):
        probe(cache, write)


def test_a_write_that_drops_elements_is_refused():
    cache, write = flash_layout()

    def lossy(key, value, kv, slots):
        write(key, value, kv, slots)
        kv[1, :, :, :, -1] = 0  # the last dim of V is never stored
    with pytest.raises(UnsupportedModel, match="found"):
        probe(cache, lossy)


def test_quantized_or_busy_caches_are_refused():
    with pytest.raises(UnsupportedModel, match="quantized"):
        probe(torch.zeros(2, BLOCKS, SLOTS, HEADS, DIM, dtype=torch.uint8), flash_layout()[1])
    cache, write = flash_layout()
    cache[0, 0, 0, 0, 0] = 1
    with pytest.raises(UnsupportedModel, match="not empty"):
        probe(cache, write)


def test_bf16_codes_are_exact():
    """The probe's codes survive a bf16 cache (at most 128 per field)."""
    cache, write = flash_layout()
    head_map = probe(cache.to(torch.bfloat16), write)
    assert head_map.block_stride == SLOTS * HEADS * DIM and head_map.base.shape == (SLOTS, HEADS, 2 * DIM)
    assert math.prod(head_map.base.shape) == torch.unique(head_map.base).numel()
