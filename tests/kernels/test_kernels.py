"""kernels/: rotate-and-splice (torch reference, Triton), the delta-rotation
table and the backend dispatch.

Every case builds its tensors on the CPU; the backends run on each device the
process has (``on_device`` copies the arguments there and the pools back).
Triton runs one way per process: interpreted on CPU tensors with
``TRITON_INTERPRET=1`` (the default here), compiled on CUDA tensors with
``TRITON_INTERPRET=0`` (``make gpu-check`` runs this file that way).

Run: TRITON_INTERPRET=1 python -m pytest -q tests/kernels/test_kernels.py
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import leyline_kernels as kernels
from leyline_kernels import (
    delta_rotation_table,
    kernel_backend,
    rotate_and_splice,
    rotate_and_splice_torch,
    rotate_and_splice_triton,
)
from leyline_kernels.rotate_and_splice_torch import _rotate_and_splice_torch_impl
from leyline_kernels.rotate_and_splice_triton import triton_available

REPO = Path(__file__).resolve().parents[2]
HAS_TRITON = triton_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="needs triton with TRITON_INTERPRET=1 (CPU)"
)
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
needs_compiled_triton = pytest.mark.skipif(
    not (HAS_CUDA and HAS_TRITON and not INTERPRET), reason="needs CUDA and triton with TRITON_INTERPRET=0"
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
EDGE_DELTAS = [0, 1, -1, 127, 128, 129, 1024, -1024, 100_003]

# MLA-like row: [c_kv (64 cols) | k_pe (32 cols)]
KV_LORA, ROPE = 64, 32
WIDTH = KV_LORA + ROPE
BLOCK = 16  # paged pool block size (tokens per block)


# ----------------------------------------------------------------- helpers

def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.dtype])


def assert_bitwise(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    diff = (bits(a) != bits(b))
    assert not bool(diff.any()), f"{int(diff.sum())} elements differ bitwise"


def deepseek_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def yarn_inv_freq(dim: int, factor: float = 40.0, low: float = 3.0, high: float = 11.0) -> torch.Tensor:
    """A YaRN-style blend: extrapolated (original) frequencies for the fast
    dims, interpolated (divided by ``factor``) for the slow ones, a linear
    ramp in between."""
    extra = deepseek_inv_freq(dim)
    inter = extra / factor
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
    return inter * ramp + extra * (1.0 - ramp)


def rope_from_scratch(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate pre-rope vectors ``x`` [n, D] (float64) to positions ``pos``,
    half-split pair layout, all in float64."""
    half = x.shape[1] // 2
    ang = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[:, :half], x[:, half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=1)


def paged_rows(block_table, start: int, count: int) -> torch.Tensor:
    """Pool rows of token positions [start, start+count) of a sequence whose
    block table is ``block_table`` (row = block * BLOCK + slot)."""
    t = torch.arange(start, start + count)
    bt = torch.as_tensor(block_table, dtype=torch.int64)
    return bt[t // BLOCK] * BLOCK + t % BLOCK


def paged_case(num_blocks: int, count: int, src_start: int, dst_start: int, seed: int):
    """Source and destination block tables: disjoint, non-contiguous block
    lists of one pool; spans start mid-block so every span crosses blocks."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g)
    nb_src = (src_start + count + BLOCK - 1) // BLOCK
    nb_dst = (dst_start + count + BLOCK - 1) // BLOCK
    assert nb_src + nb_dst <= num_blocks
    src_bt, dst_bt = perm[:nb_src], perm[nb_src:nb_src + nb_dst]
    return paged_rows(src_bt, src_start, count), paged_rows(dst_bt, dst_start, count)


def random_pool(num_rows: int, width: int, dtype, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_rows, width, generator=g) * scale).to(dtype)


def on_device(fn, device: str):
    """``fn`` run on ``device`` copies of its tensor arguments; the pools' results are copied
    back into the caller's pools (one copy when they are the same tensor), so every assertion
    reads CPU tensors whichever device computed them."""
    if device == "cpu":
        return fn

    def run(src_pool, dst_pool, *args, **kwargs):
        src = src_pool.to(device)
        dst = src if dst_pool is src_pool else dst_pool.to(device)
        fn(src, dst, *(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
        src_pool.copy_(src.cpu())
        dst_pool.copy_(dst.cpu())

    return run


BACKENDS = [
    pytest.param(rotate_and_splice_torch, id="torch-cpu"),
    pytest.param(rotate_and_splice_triton, id="triton-cpu", marks=needs_triton),
    pytest.param(on_device(rotate_and_splice_torch, "cuda"), id="torch-cuda", marks=needs_cuda),
    pytest.param(on_device(rotate_and_splice_triton, "cuda"), id="triton-cuda", marks=needs_compiled_triton),
]
# Triton against the CPU torch reference: interpreted on CPU tensors, compiled on CUDA ones.
TRITON_DEVICES = [
    pytest.param("cpu", id="cpu", marks=needs_triton),
    pytest.param("cuda", id="cuda", marks=needs_compiled_triton),
]


def triton_on(device: str):
    return on_device(rotate_and_splice_triton, device)


# The dispatching entry point, on each device (on CUDA it picks Triton when triton imports).
DISPATCHES = [
    pytest.param(rotate_and_splice, id="dispatch-cpu"),
    pytest.param(on_device(rotate_and_splice, "cuda"), id="dispatch-cuda", marks=needs_cuda),
]


# ------------------------------------------------- delta_rotation_table

def test_table_one_row_per_distinct_delta_float64_angles():
    deltas = torch.tensor([5, -3, 5, 0, 100_000, -3, 5])
    inv = deepseek_inv_freq(ROPE).to(torch.float32)  # any float dtype is accepted
    di, cos, sin = delta_rotation_table(deltas, inv, "cpu")
    assert di.dtype == torch.int64 and di.shape == (7,)
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    assert cos.shape == (4, ROPE // 2) and sin.shape == (4, ROPE // 2)
    inv64 = inv.to(torch.float64)
    for i, d in enumerate(deltas.tolist()):
        ang = float(d) * inv64
        assert torch.equal(cos[di[i]], torch.cos(ang).to(torch.float32))
        assert torch.equal(sin[di[i]], torch.sin(ang).to(torch.float32))
    # same delta -> same table row
    assert di[0] == di[2] == di[6] and di[1] == di[5]
    # delta 0 is the identity exactly
    assert torch.equal(cos[di[3]], torch.ones(ROPE // 2)) and torch.equal(sin[di[3]], torch.zeros(ROPE // 2))


def test_table_angles_not_from_fp32_position_difference():
    """At p ~ 100k the fp32 angle difference fp32(p'θ) - fp32(pθ) is off by
    ~1e-3 rad; the table is built from δ itself, so it does not care about p."""
    inv = deepseek_inv_freq(ROPE)
    p, d = 100_000, 129
    _, cos, sin = delta_rotation_table(torch.tensor([d]), inv, "cpu")
    exact = d * inv
    naive = (torch.tensor(float(p + d)) * inv.float() - torch.tensor(float(p)) * inv.float()).double()
    assert (naive - exact).abs().max() > 1e-4  # the trap is real
    got = torch.atan2(sin.double(), cos.double())[0]
    wrapped = torch.remainder(exact + torch.pi, 2 * torch.pi) - torch.pi
    assert (got - wrapped).abs().max() < 1e-6


def test_table_rejects_bad_input():
    inv = deepseek_inv_freq(ROPE)
    with pytest.raises(ValueError):
        delta_rotation_table(torch.tensor([1.5]), inv, "cpu")
    with pytest.raises(ValueError):
        delta_rotation_table(torch.tensor([1]), inv[None, :], "cpu")
    with pytest.raises(ValueError):
        delta_rotation_table(torch.tensor([1]), torch.tensor([1.0, float("nan")]), "cpu")


# -------------------------------------- torch reference vs Triton kernel

@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("same_pool", [True, False], ids=["same-pool", "two-pools"])
def test_triton_bit_identical_to_torch_paged(dtype, same_pool, device):
    count = 1100  # > 2 programs of 512 rows, last one partial
    num_blocks = 160
    src_rows, dst_rows = paged_case(num_blocks, count, src_start=5, dst_start=11, seed=7)
    g = torch.Generator().manual_seed(3)
    deltas = torch.tensor(EDGE_DELTAS)[torch.randint(0, len(EDGE_DELTAS), (count,), generator=g)]
    inv = yarn_inv_freq(ROPE) if same_pool else deepseek_inv_freq(ROPE)
    di, cos, sin = delta_rotation_table(deltas, inv, "cpu")
    src = random_pool(num_blocks * BLOCK, WIDTH, dtype, seed=11)
    if same_pool:
        ref, out = src.clone(), src.clone()
        ref_dst, out_dst = ref, out
    else:
        ref, out = src.clone(), src.clone()
        dst0 = random_pool(num_blocks * BLOCK + 37, WIDTH, dtype, seed=12)
        ref_dst, out_dst = dst0.clone(), dst0.clone()
        # two-pool case: dst rows may coincide with src row numbers
        dst_rows = torch.randperm(dst0.shape[0], generator=g)[:count]
    before = src.clone()
    rotate_and_splice_torch(ref, ref_dst, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    triton_on(device)(out, out_dst, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    assert_bitwise(out_dst, ref_dst)
    assert_bitwise(out, ref)
    # the source rows are untouched
    assert_bitwise(out[src_rows], before[src_rows])
    # something was actually rotated
    moved = deltas != 0
    assert not torch.equal(bits(ref_dst[dst_rows[moved], KV_LORA:]), bits(before[src_rows[moved], KV_LORA:]))


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize(
    "width,rope_offset,rope_dim",
    [(96, 0, 32),      # [k_pe | c_kv]
     (100, 40, 24),    # rope in the middle, half = 12 (not a power of two)
     (576, 512, 64)],  # DeepSeek-V2/V3: kv_lora_rank 512 + qk_rope_head_dim 64
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_triton_bit_identical_other_layouts(width, rope_offset, rope_dim, dtype, device):
    count = 300
    src_rows, dst_rows = paged_case(48, count, src_start=3, dst_start=0, seed=width)
    deltas = torch.tensor(EDGE_DELTAS).repeat(count // len(EDGE_DELTAS) + 1)[:count]
    di, cos, sin = delta_rotation_table(deltas, deepseek_inv_freq(rope_dim), "cpu")
    pool = random_pool(48 * BLOCK, width, dtype, seed=5)
    ref, out = pool.clone(), pool.clone()
    rotate_and_splice_torch(ref, ref, src_rows, dst_rows, di, cos, sin, rope_offset, rope_dim)
    triton_on(device)(out, out, src_rows, dst_rows, di, cos, sin, rope_offset, rope_dim)
    assert_bitwise(out, ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0 and fp16 overflow are intended here
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_is_round_to_nearest_even(backend, dtype):
    """x1 = 1, x2 = 0 and a hand-made cos row make out1 = cos exactly, so the
    fp32 -> pool-dtype rounding of arbitrary fp32 values is exercised: ties to
    even, carries into the exponent, overflow, subnormals, signed values."""
    f32 = lambda u: torch.tensor([u], dtype=torch.int64).to(torch.int32).view(torch.float32).item()  # noqa: E731
    targets = [
        f32(0x3F808000), f32(0x3F818000), f32(0x3F80FFFF), f32(0x3F807FFF), f32(0x3F808001),
        f32(0xBF808000), f32(0xBF818000), f32(0x7F7FFFFF), f32(0x00008000), f32(0x00018000),
        f32(0x007FFFFF), f32(0x80018000),
        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, -(1.0 + 2.0 ** -11), 65519.0, 65520.0, 70000.0,
        2.0 ** -25, 3 * 2.0 ** -26, 1e-6, -1e-6, 2049.0, 2051.0, 1.0 / 3.0, -0.0,
        float("inf"), float("-inf"), 1e30, 3.14159265,
    ]
    half = len(targets)
    rope_dim = 2 * half
    cos = torch.tensor([targets], dtype=torch.float32)
    sin = torch.zeros_like(cos)
    pool = torch.zeros(4, rope_dim + 2, dtype=dtype)
    pool[0, :half] = 1.0
    pool[0, half:rope_dim] = 0.0
    pool[0, rope_dim:] = 7.0
    backend(pool, pool, torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), cos, sin, 0, rope_dim)
    expected = cos[0].to(dtype)  # torch's conversion: round to nearest even
    assert_bitwise(pool[2, :half], expected)
    truncated = (cos[0].view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    if dtype == torch.bfloat16:  # the targets do tell rounding from truncation
        assert not torch.equal(bits(expected), bits(truncated))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_special_inputs(backend):
    """Subnormal bf16/fp16 inputs survive delta 0; NaN stays NaN."""
    for dtype in (torch.bfloat16, torch.float16):
        tiny = torch.finfo(dtype).tiny
        vals = torch.tensor([tiny / 2, -tiny / 4, tiny * 3 / 8, tiny, 1.5, -2.0], dtype=dtype)
        pool = torch.zeros(2, 12, dtype=dtype)
        pool[0, :6] = vals
        pool[0, 6:] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        di, cos, sin = delta_rotation_table(torch.tensor([0]), deepseek_inv_freq(12), "cpu")
        backend(pool, pool, torch.tensor([0]), torch.tensor([1]), di, cos, sin, 0, 12)
        assert_bitwise(pool[1], pool[0])
        pool[0, 0] = float("nan")
        backend(pool, pool, torch.tensor([0]), torch.tensor([1]), di, cos, sin, 0, 12)
        assert torch.isnan(pool[1, 0]) and torch.isnan(pool[1, 6])  # x1*s contributes NaN to out2


# ------------------------------------------ against positions from scratch

@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("inv_name", ["deepseek", "yarn"])
@pytest.mark.parametrize("p0", [2000, 100_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_matches_rope_recomputed_from_scratch(dtype, p0, inv_name, dispatch):
    inv = deepseek_inv_freq(ROPE) if inv_name == "deepseek" else yarn_inv_freq(ROPE)
    count = 2000
    src_rows, dst_rows = paged_case(300, count, src_start=9, dst_start=2, seed=p0)
    g = torch.Generator().manual_seed(p0 + 1)
    x = torch.randn(count, ROPE, dtype=torch.float64, generator=g)  # pre-rope k_pe
    pos = p0 + torch.arange(count)
    deltas = torch.tensor(EDGE_DELTAS[:-1])[torch.arange(count) % (len(EDGE_DELTAS) - 1)]
    pool = torch.zeros(300 * BLOCK, WIDTH, dtype=dtype)
    pool[src_rows, KV_LORA:] = rope_from_scratch(x, pos, inv).to(torch.float32).to(dtype)
    di, cos, sin = delta_rotation_table(deltas, inv, "cpu")
    dispatch(pool, pool, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    got = pool[dst_rows, KV_LORA:].to(torch.float64)
    exact = rope_from_scratch(x, pos + deltas, inv)
    h = ROPE // 2
    pair = torch.sqrt(x[:, :h] ** 2 + x[:, h:] ** 2).repeat(1, 2)  # rotation-invariant scale
    if dtype == torch.float32:
        err = ((got - exact).abs() / pair).max().item()
        assert err < 1e-6, err  # measured ~1.7e-7
    else:
        ref = exact.to(torch.float32).to(dtype).to(torch.float64)
        diff = (got - ref).abs()
        # The k_pe stored at p is itself bf16-rounded, and the rotation mixes
        # the two halves of a pair, so the error scale is the pair's magnitude:
        # within one bf16 ulp of the pair's binade.
        ulp_pair = torch.exp2(torch.floor(torch.log2(pair)) - 7)
        assert bool((diff <= ulp_pair).all()), (diff / ulp_pair).max().item()
        # ...and the rounding itself is exact to within one ulp of the element,
        # measured against the stored bf16 input rotated exactly by δ.
        stored = pool[src_rows, KV_LORA:].to(torch.float64)
        exact_from_stored = rope_from_scratch(stored, deltas, inv)
        ulp_el = torch.exp2(torch.floor(torch.log2(exact_from_stored.abs())) - 7)
        big = exact_from_stored.abs() > 1e-3 * pair
        assert bool(((got - exact_from_stored).abs() <= ulp_el)[big].all())


# ------------------------------- interleaved pair layout (vLLM's k_pe)

def rope_interleaved_from_scratch(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate pre-rope vectors ``x`` [n, D] (float64) to positions ``pos`` with
    pair j = dims (2j, 2j+1) (vLLM's DeepSeek rotary, ``is_neox_style=False``)."""
    ang = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = x1 * c - x2 * s
    out[:, 1::2] = x2 * c + x1 * s
    return out


def _interleaved_case(dtype, count=700, p0=3000, seed=0):
    """A DeepSeek-shaped pool (512 + 64) whose k_pe rows hold pre-rope vectors
    rotated in the interleaved layout to ``p0 + i``."""
    width, offset, rope = 576, 512, 64
    inv = yarn_inv_freq(rope)
    src_rows, dst_rows = paged_case(100, count, src_start=4, dst_start=1, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(count, rope, dtype=torch.float64, generator=g)
    pos = p0 + torch.arange(count)
    deltas = torch.tensor(EDGE_DELTAS[:-1])[torch.arange(count) % (len(EDGE_DELTAS) - 1)]
    pool = random_pool(100 * BLOCK, width, dtype, seed=seed + 2)
    pool[src_rows, offset:] = rope_interleaved_from_scratch(x, pos, inv).to(torch.float32).to(dtype)
    di, cos, sin = delta_rotation_table(deltas, inv, "cpu")
    exact = rope_interleaved_from_scratch(x, pos + deltas, inv)
    pair = torch.sqrt(x[:, 0::2] ** 2 + x[:, 1::2] ** 2).repeat_interleave(2, dim=1)
    return pool, (src_rows, dst_rows, di, cos, sin, offset, rope), exact, pair


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_interleaved_layout_matches_fp64_reference(backend, dtype):
    pool, args, exact, pair = _interleaved_case(dtype)
    src_rows, dst_rows = args[0], args[1]
    before = pool.clone()
    backend(pool, pool, *args, pair_layout="interleaved")
    got = pool[dst_rows, 512:].to(torch.float64)
    err = ((got - exact).abs() / pair).max().item()
    # fp32: rounding only (~2e-7); bf16: the stored input and the output are
    # bf16-rounded, each within 2^-8 of the pair's magnitude.
    assert err < (1e-6 if dtype == torch.float32 else 2 * 2.0 ** -8), err
    assert_bitwise(pool[dst_rows, :512], before[src_rows, :512])  # c_kv copied bit for bit


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_interleaved_triton_bit_identical_to_torch(dtype, device):
    pool, args, _, _ = _interleaved_case(dtype, seed=5)
    ref, out = pool.clone(), pool.clone()
    rotate_and_splice_torch(ref, ref, *args, pair_layout="interleaved")
    triton_on(device)(out, out, *args, pair_layout="interleaved")
    assert_bitwise(out, ref)


@pytest.mark.parametrize("backend", BACKENDS + DISPATCHES)
def test_wrong_pair_layout_is_caught_by_the_reference(backend):
    """Negative control: rotating interleaved rows as half-split pairs is far off."""
    pool, args, exact, pair = _interleaved_case(torch.float32, seed=9)
    backend(pool, pool, *args)  # default: half-split
    got = pool[args[1], 512:].to(torch.float64)
    assert ((got - exact).abs() / pair).max().item() > 0.1


# ------------------------------------------- bitwise copies, delta zero

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_position_free_columns_copied_bitwise(backend, dtype):
    count = 700
    src_rows, dst_rows = paged_case(100, count, src_start=15, dst_start=1, seed=21)
    g = torch.Generator().manual_seed(4)
    pool = random_pool(100 * BLOCK, WIDTH, dtype, seed=2)
    # arbitrary bit patterns in the latent: NaN payloads, infs, -0.0, subnormals
    ib = BITS[dtype]
    info = torch.iinfo(ib)
    raw = torch.randint(info.min, info.max, (pool.shape[0], KV_LORA), dtype=torch.int64, generator=g).to(ib)
    pool[:, :KV_LORA] = raw.view(dtype)
    before = pool.clone()
    deltas = torch.randint(-5000, 5000, (count,), generator=g)
    di, cos, sin = delta_rotation_table(deltas, deepseek_inv_freq(ROPE), "cpu")
    backend(pool, pool, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    assert torch.equal(bits(pool[dst_rows, :KV_LORA]), bits(before[src_rows, :KV_LORA]))
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[dst_rows] = False
    assert torch.equal(bits(pool[untouched]), bits(before[untouched]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_delta_zero_leaves_rope_unchanged(backend, dtype):
    count = 333
    src_rows, dst_rows = paged_case(60, count, src_start=7, dst_start=9, seed=8)
    pool = random_pool(60 * BLOCK, WIDTH, dtype, seed=9)
    before = pool.clone()
    di, cos, sin = delta_rotation_table(torch.zeros(count, dtype=torch.int64), yarn_inv_freq(ROPE), "cpu")
    backend(pool, pool, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    assert torch.equal(bits(pool[dst_rows]), bits(before[src_rows]))


def test_torch_chunking_does_not_change_results():
    count = 1000
    src_rows, dst_rows = paged_case(140, count, src_start=1, dst_start=4, seed=1)
    deltas = torch.randint(-300, 300, (count,))
    di, cos, sin = delta_rotation_table(deltas, deepseek_inv_freq(ROPE), "cpu")
    pool = random_pool(140 * BLOCK, WIDTH, torch.bfloat16, seed=3)
    a, b = pool.clone(), pool.clone()
    _rotate_and_splice_torch_impl(a, a, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    _rotate_and_splice_torch_impl(b, b, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE, chunk_rows=97)
    assert_bitwise(a, b)


def run_case(count: int, tail: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """An edit's moved rows as the runtime sees them when its blocks sit next to each other:
    ``count - tail`` rows consecutive in both pools (one long run, starting mid-block), then
    ``tail`` paged rows in random blocks. Returns (src rows, dst rows, pool rows)."""
    run = count - tail
    num_blocks = 2 * (run // BLOCK + 2) + 2 * (tail // BLOCK + 2)
    src_run = torch.arange(5, 5 + run)
    dst_run = torch.arange(5 + run + 7, 5 + 2 * run + 7)
    first_free = (5 + 2 * run + 7) // BLOCK + 1
    tail_src, tail_dst = paged_case(num_blocks - first_free, tail, src_start=3, dst_start=9, seed=seed)
    offset = first_free * BLOCK
    return (torch.cat((src_run, tail_src + offset)), torch.cat((dst_run, tail_dst + offset)),
            num_blocks * BLOCK)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("pair_layout", ["half_split", "interleaved"])
@pytest.mark.parametrize("several_edits", [False, True], ids=["one-delta", "several-deltas"])
def test_torch_runs_copied_as_slices_match_the_indexed_path(dtype, pair_layout, several_edits):
    """Rows in long consecutive runs of one delta take the slice-copy path; the result is bit
    for bit the gather/scatter path's, for every row, including chunks that split a run."""
    count = 1300
    src_rows, dst_rows, num_rows = run_case(count, tail=140, seed=4)
    g = torch.Generator().manual_seed(5)
    if not several_edits:  # one deletion: every row moves by the same delta
        deltas = torch.full((count,), -1994)
    else:  # several edits: runs of rows per delta, then rows of mixed deltas
        runs = torch.repeat_interleave(torch.tensor([-1994, 1, 0, 127, -1]),
                                       torch.tensor([400, 17, 300, 283, 160]))
        mixed = torch.tensor(EDGE_DELTAS)[torch.randint(0, len(EDGE_DELTAS), (count - len(runs),), generator=g)]
        deltas = torch.cat((runs, mixed))
    di, cos, sin = delta_rotation_table(deltas, yarn_inv_freq(ROPE), "cpu")
    pool = random_pool(num_rows, WIDTH, dtype, seed=6)
    by_slices, by_index = pool.clone(), pool.clone()
    args = (src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    _rotate_and_splice_torch_impl(by_slices, by_slices, *args, chunk_rows=97, pair_layout=pair_layout,
                                  min_run=256)
    _rotate_and_splice_torch_impl(by_index, by_index, *args, pair_layout=pair_layout, min_run=count + 1)
    assert_bitwise(by_slices, by_index)
    assert not torch.equal(bits(by_slices[dst_rows]), bits(pool[src_rows]))  # rows were rotated
    untouched = torch.ones(num_rows, dtype=torch.bool)
    untouched[dst_rows] = False
    assert_bitwise(by_slices[untouched], pool[untouched])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_triton_bit_identical_to_torch_runs(dtype, device):
    """The slice-copy path against the independent Triton kernel."""
    count = 1100
    src_rows, dst_rows, num_rows = run_case(count, tail=60, seed=8)
    di, cos, sin = delta_rotation_table(torch.full((count,), -1994), deepseek_inv_freq(ROPE), "cpu")
    pool = random_pool(num_rows, WIDTH, dtype, seed=9)
    ref, out = pool.clone(), pool.clone()
    rotate_and_splice_torch(ref, ref, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    triton_on(device)(out, out, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    assert_bitwise(out, ref)


@pytest.mark.parametrize("backend", BACKENDS + DISPATCHES)
def test_empty_and_int32_indices(backend):
    pool = random_pool(64, WIDTH, torch.float32, seed=0)
    before = pool.clone()
    di, cos, sin = delta_rotation_table(torch.tensor([], dtype=torch.int64), deepseek_inv_freq(ROPE), "cpu")
    empty = torch.tensor([], dtype=torch.int64)
    backend(pool, pool, empty, empty, di, cos, sin, KV_LORA, ROPE)
    assert torch.equal(pool, before)
    di, cos, sin = delta_rotation_table(torch.tensor([3, 3]), deepseek_inv_freq(ROPE), "cpu")
    src = torch.tensor([1, 2], dtype=torch.int32)
    dst = torch.tensor([40, 41], dtype=torch.int32)
    backend(pool, pool, src, dst, di.to(torch.int32), cos, sin, KV_LORA, ROPE)
    assert torch.equal(pool[40:42, :KV_LORA], before[1:3, :KV_LORA])


# --------------------------------------------------------------- dispatch

def test_backend_default_and_env_override(monkeypatch):
    monkeypatch.delenv("LEYLINE_KERNEL", raising=False)
    assert kernel_backend("cpu") == "torch"
    assert kernel_backend(torch.device("cpu")) == "torch"
    assert kernel_backend(torch.zeros(1)) == "torch"
    assert kernel_backend(torch.device("cuda")) == ("triton" if HAS_TRITON else "torch")
    monkeypatch.setenv("LEYLINE_KERNEL", "torch")
    assert kernel_backend("cuda") == "torch"
    monkeypatch.setenv("LEYLINE_KERNEL", "triton")
    assert kernel_backend("cpu") == "triton"
    monkeypatch.setenv("LEYLINE_KERNEL", "cuda-magic")
    with pytest.raises(ValueError):
        kernel_backend("cpu")


@pytest.mark.parametrize("forced", [None, "torch", "triton"])
def test_dispatch_routes_to_backend(monkeypatch, forced):
    import leyline_kernels.dispatch as dispatch

    calls = []
    monkeypatch.setattr(dispatch, "rotate_and_splice_torch", lambda *a, **k: calls.append("torch"))
    monkeypatch.setattr(dispatch, "rotate_and_splice_triton", lambda *a, **k: calls.append("triton"))
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    if forced is None:
        monkeypatch.delenv("LEYLINE_KERNEL", raising=False)
    else:
        monkeypatch.setenv("LEYLINE_KERNEL", forced)
    pool = random_pool(32, WIDTH, torch.float32, seed=0)
    di, cos, sin = delta_rotation_table(torch.tensor([1]), deepseek_inv_freq(ROPE), "cpu")
    rotate_and_splice(pool, pool, torch.tensor([0]), torch.tensor([1]), di, cos, sin, KV_LORA, ROPE)
    assert calls == [forced or "torch"]


@needs_triton
def test_dispatch_forced_triton_runs_interpreter(monkeypatch):
    monkeypatch.setenv("LEYLINE_KERNEL", "triton")
    count = 200
    src_rows, dst_rows = paged_case(30, count, src_start=3, dst_start=3, seed=2)
    di, cos, sin = delta_rotation_table(torch.full((count,), 128), deepseek_inv_freq(ROPE), "cpu")
    pool = random_pool(30 * BLOCK, WIDTH, torch.bfloat16, seed=6)
    a, b = pool.clone(), pool.clone()
    rotate_and_splice(a, a, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    rotate_and_splice_torch(b, b, src_rows, dst_rows, di, cos, sin, KV_LORA, ROPE)
    assert_bitwise(a, b)


def _valid_args():
    pool = random_pool(64, WIDTH, torch.float32, seed=0)
    di, cos, sin = delta_rotation_table(torch.tensor([1, 2, 1]), deepseek_inv_freq(ROPE), "cpu")
    return dict(src_pool=pool, dst_pool=pool, src_rows=torch.tensor([0, 1, 2]), dst_rows=torch.tensor([10, 11, 12]),
                delta_index=di, cos=cos, sin=sin, rope_offset=KV_LORA, rope_dim=ROPE)


def _bad(**changes):
    def make():
        args = _valid_args()
        for k, v in changes.items():
            args[k] = v(args) if callable(v) else v
        return args
    return make


BAD_ARGS = {
    "pool-1d": _bad(src_pool=lambda a: a["src_pool"][0], dst_pool=lambda a: a["src_pool"][0]),
    "pool-int": _bad(src_pool=torch.zeros(64, WIDTH, dtype=torch.int32),
                     dst_pool=torch.zeros(64, WIDTH, dtype=torch.int32)),
    "pool-float64": _bad(src_pool=torch.zeros(64, WIDTH, dtype=torch.float64),
                         dst_pool=torch.zeros(64, WIDTH, dtype=torch.float64)),
    "dtype-mismatch": _bad(dst_pool=torch.zeros(64, WIDTH, dtype=torch.bfloat16)),
    "width-mismatch": _bad(dst_pool=torch.zeros(64, WIDTH + 1)),
    "odd-rope-dim": _bad(rope_dim=31),
    "zero-rope-dim": _bad(rope_dim=0),
    "rope-past-width": _bad(rope_offset=KV_LORA + 2),
    "negative-offset": _bad(rope_offset=-1),
    "float-offset": _bad(rope_offset=64.0),
    "length-mismatch": _bad(dst_rows=torch.tensor([10, 11])),
    "delta-index-length": _bad(delta_index=torch.tensor([0, 1])),
    "src-row-out-of-range": _bad(src_rows=torch.tensor([0, 1, 64])),
    "negative-row": _bad(dst_rows=torch.tensor([10, -1, 12])),
    "delta-index-out-of-range": _bad(delta_index=torch.tensor([0, 1, 2])),
    "float-rows": _bad(src_rows=torch.tensor([0.0, 1.0, 2.0])),
    "2d-rows": _bad(src_rows=torch.tensor([[0, 1, 2]])),
    "cos-shape": _bad(cos=lambda a: a["cos"][:, :4], sin=lambda a: a["sin"][:, :4]),
    "cos-float64": _bad(cos=lambda a: a["cos"].double()),
    "sin-shape-differs": _bad(sin=lambda a: a["sin"][:1]),
    "duplicate-dst": _bad(dst_rows=torch.tensor([10, 11, 10])),
    "overlap-same-pool": _bad(dst_rows=torch.tensor([10, 2, 12])),
    "not-a-tensor": _bad(src_rows=[0, 1, 2]),
    "unknown-pair-layout": _bad(pair_layout="neox"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS), ids=list(BAD_ARGS))
@pytest.mark.parametrize("fn", [rotate_and_splice, rotate_and_splice_torch, rotate_and_splice_triton],
                         ids=["dispatch", "torch", "triton"])
def test_invalid_args_raise_value_error(fn, case):
    args = BAD_ARGS[case]()
    before = args["dst_pool"].clone() if isinstance(args["dst_pool"], torch.Tensor) else None
    with pytest.raises(ValueError):
        fn(**args)
    if before is not None:
        assert torch.equal(args["dst_pool"], before)  # nothing written


def test_same_rows_in_two_pools_is_fine():
    args = _valid_args()
    args["dst_pool"] = args["src_pool"].clone()
    args["dst_rows"] = args["src_rows"].clone()
    rotate_and_splice(**args)


def test_import_without_triton():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'triton' or name.startswith('triton.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\nimport leyline_kernels as kernels\n"
        "assert kernels.kernel_backend('cuda') == 'torch'\n"
        "p = torch.randn(8, 96)\n"
        "di, c, s = kernels.delta_rotation_table(torch.tensor([1]), torch.ones(16), 'cpu')\n"
        "kernels.rotate_and_splice(p, p, torch.tensor([0]), torch.tensor([1]), di, c, s, 64, 32)\n"
        "try:\n"
        "    kernels.rotate_and_splice_triton(p, p, torch.tensor([0]), torch.tensor([2]), di, c, s, 64, 32)\n"
        "except RuntimeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('expected RuntimeError')\n"
        "assert 'triton' not in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env.pop("LEYLINE_KERNEL", None)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_public_api():
    assert set(kernels.__all__) >= {
        "rotate_and_splice", "rotate_and_splice_torch", "rotate_and_splice_triton",
        "delta_rotation_table", "kernel_backend",
    }
