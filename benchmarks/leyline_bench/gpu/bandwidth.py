"""``make gpu-check``'s bandwidth step: the Triton rotate-and-splice against a plain indexed copy.

One case is an edit that moves ``tokens`` cached tokens of a model's cache: its rows are
``tokens x layers x rows_per_token`` rows of one row layout, spread over a paged pool (random
blocks of 16). Every arm reads those rows and writes them elsewhere, so every arm's GB/s is
``2 * rows * width * itemsize / median time``:

* ``copy``: ``index_select`` into a buffer, then ``index_copy_`` into the pool (no rotation; what
  moving rows costs in plain torch, and the bar the kernel is measured against);
* ``triton``: :func:`leyline_kernels.rotate_and_splice_triton`, as the runtime calls it (its argument
  checks, which look at every row index, included);
* ``triton_kernel``: the same kernel launched without those checks;
* ``torch``: :func:`leyline_kernels.rotate_and_splice_torch`, the CPU path, for reference.

Each case also checks that the Triton rows equal the torch rows bit for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from leyline_kernels import delta_rotation_table, rotate_and_splice_torch, rotate_and_splice_triton
from leyline_kernels.rotate_and_splice_triton import _rotate_and_splice_triton_impl

from ..common.stats import median, ratio, rotated

BLOCK = 16  # tokens per block of the paged pool
DELTA = -100  # one edit: every moved row shifts by the same delta


@dataclass(frozen=True)
class RowShape:
    """One model's cache row: ``width`` columns, the rope slice ``[rope_offset, rope_offset +
    rope_dim)``, ``rows_per_token`` rows per token and layer."""

    name: str
    width: int
    rope_offset: int
    rope_dim: int
    layers: int
    rows_per_token: int = 1
    rope_theta: float = 10000.0


SHAPES = (
    # MLA: c_kv (kv_lora_rank 512) | k_pe (qk_rope_head_dim 64), one row per token and layer.
    RowShape("deepseek-v2-lite", 576, 512, 64, layers=27),
    RowShape("deepseek-v3", 576, 512, 64, layers=61),
    # GQA (Llama-3-8B-like: 8 KV heads x head_dim 128, 32 layers): one row per KV head, its K
    # (all of it roped, half-split) then its V (copied as is).
    RowShape("gqa-8x128", 256, 0, 128, layers=32, rows_per_token=8, rope_theta=500000.0),
)


class Case:
    """The pool, the rows and the rotation table of one (shape, tokens) cell."""

    def __init__(self, shape: RowShape, tokens: int, dtype: torch.dtype, device: str, seed: int = 0):
        self.shape, self.tokens, self.device = shape, tokens, device
        self.rows = tokens * shape.layers * shape.rows_per_token
        blocks = -(-self.rows // BLOCK)
        # Source and destination blocks disjoint and scattered, as a paged cache leaves them.
        perm = torch.randperm(2 * blocks + 2, generator=torch.Generator().manual_seed(seed))
        slots = torch.arange(BLOCK)
        self.src = (perm[:blocks, None] * BLOCK + slots).flatten()[: self.rows].to(device)
        self.dst = (perm[blocks: 2 * blocks, None] * BLOCK + slots).flatten()[: self.rows].to(device)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.pool = torch.randn((2 * blocks + 2) * BLOCK, shape.width, generator=gen, device=device, dtype=dtype)
        self.buffer = self.pool.new_empty(self.rows, shape.width)
        inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.rope_dim, 2, dtype=torch.float64)
                                               / shape.rope_dim))
        self.index, self.cos, self.sin = delta_rotation_table(torch.full((self.rows,), DELTA), inv_freq, device)
        self.bytes = 2 * self.rows * shape.width * self.pool.element_size()

    def arms(self) -> dict:
        return {"copy": self.copy, "triton": self.triton, "triton_kernel": self.triton_kernel,
                "torch": self.torch_path}

    def copy(self) -> None:
        torch.index_select(self.pool, 0, self.src, out=self.buffer)
        self.pool.index_copy_(0, self.dst, self.buffer)

    def triton(self) -> None:
        s = self.shape
        rotate_and_splice_triton(self.pool, self.pool, self.src, self.dst, self.index, self.cos, self.sin,
                                 s.rope_offset, s.rope_dim)

    def triton_kernel(self) -> None:
        s = self.shape
        _rotate_and_splice_triton_impl(self.pool, self.pool, self.src, self.dst, self.index, self.cos, self.sin,
                                       s.rope_offset, s.rope_dim)

    def torch_path(self) -> None:
        s = self.shape
        rotate_and_splice_torch(self.pool, self.pool, self.src, self.dst, self.index, self.cos, self.sin,
                                s.rope_offset, s.rope_dim)

    def triton_equals_torch(self) -> bool:
        """The destination rows the two paths write are the same bits (sources are never written)."""
        self.torch_path()
        reference = self.pool[self.dst].clone()
        self.pool[self.dst] = 0
        self.triton()
        bits = torch.int16 if self.pool.element_size() == 2 else torch.int32
        return torch.equal(self.pool[self.dst].view(bits), reference.view(bits))

    def seconds(self, fn) -> float:
        return seconds(self.device, fn)


def seconds(device: str, fn) -> float:
    """One call of ``fn`` on ``device``: CUDA events on a GPU, the wall clock on the CPU."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(shape: RowShape, tokens: int, dtype: torch.dtype, device: str, reps: int) -> dict:
    """GB/s of each arm (medians of ``reps`` interleaved runs, order rotated) and the ratios to copy."""
    case = Case(shape, tokens, dtype, device)
    identical = case.triton_equals_torch()  # also the warm-up (and Triton's compile) of both paths
    case.copy()
    samples: dict[str, list[float]] = {name: [] for name in case.arms()}
    for r in range(reps):
        for name in rotated(list(samples), r):
            samples[name].append(case.seconds(case.arms()[name]))
    gbps = {name: case.bytes / median(v) / 1e9 for name, v in samples.items()}
    result = {"shape": shape.name, "tokens": tokens, "layers": shape.layers, "rows": case.rows,
              "row_width": shape.width, "rope_offset": shape.rope_offset, "rope_dim": shape.rope_dim,
              "dtype": str(dtype).removeprefix("torch."), "bytes_moved": case.bytes,
              "median_s": {name: median(v) for name, v in samples.items()}, "gb_per_s": gbps,
              "triton_vs_copy": ratio(gbps["triton"], gbps["copy"]),
              "triton_kernel_vs_copy": ratio(gbps["triton_kernel"], gbps["copy"]),
              "torch_vs_copy": ratio(gbps["torch"], gbps["copy"]), "triton_bit_identical_to_torch": identical}
    del case
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the next cell's pool may be larger than this one's
    return result


def measure_all(tokens: list[int], dtype: torch.dtype, device: str, reps: int, log=print) -> list[dict]:
    results = []
    for shape in SHAPES:
        for n in tokens:
            r = measure(shape, n, dtype, device, reps)
            log(f"  {shape.name} {n} tokens ({r['rows']} rows of {shape.width}): copy {r['gb_per_s']['copy']:.1f}, "
                f"triton {r['gb_per_s']['triton']:.1f}, torch {r['gb_per_s']['torch']:.1f} GB/s; "
                f"triton/copy {r['triton_vs_copy']:.2f} (kernel alone {r['triton_kernel_vs_copy']:.2f}); bit-identical {r['triton_bit_identical_to_torch']}")
            results.append(r)
    return results


def device_copy_gb_per_s(device: str, nbytes: int, reps: int) -> float:
    """The device's own bar: one ``copy_`` of ``nbytes`` into another buffer, GB/s counting bytes read
    and written (median of ``reps``), as the H200's ~4.3 TB/s was measured."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    took = median([seconds(device, lambda: dst.copy_(src)) for _ in range(reps)])
    return 2 * nbytes / took / 1e9
