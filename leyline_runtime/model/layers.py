"""Linear, RMSNorm, SwiGLU MLP and DeepSeek MoE (V2 softmax routing, V3 sigmoid + bias)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import CPU_GEMMS
from .config import MLAConfig


@functools.cache
def cpu_has_bf16_matmul() -> bool:
    """oneDNN's own test for bf16 instructions (AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (e.g. GenuineIntel, AuthenticAMD); "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.cache
def auto_cpu_gemm() -> str:
    """What ``"auto"`` picks on this CPU.

    MKL takes its fast kernels on Intel CPUs only: on a 2-core AMD EPYC with AVX-512 its sgemm ran
    1.8-2.4x slower than oneDNN's for 16-4096 rows of this model's products (same results to
    rounding; docs/design.md, "GEMM library"). oneDNN compiles its kernels for the CPU it finds. On
    Intel CPUs MKL stays: on a 2-core Xeon with AMX oneDNN took 1.09-1.34x MKL's time at 1-4096 rows.
    """
    if not onednn_available():
        return "blas"
    return "blas" if cpu_vendor() == "GenuineIntel" else "onednn"


@functools.cache  # asked on every product in batch-invariant mode; the build does not change
def onednn_available() -> bool:
    """torch was built with oneDNN and has the linear operators used here (torch 2.13 has)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


# A process setting, like torch's thread count: models and engines in one process share it.
_cpu_gemm = "auto"


def set_cpu_gemm(choice: str) -> None:
    """fp32 CPU inference products of every :class:`Linear` run on ``choice`` (one of :data:`CPU_GEMMS`)."""
    global _cpu_gemm
    if choice not in CPU_GEMMS:
        raise ValueError(f"cpu_gemm must be one of {CPU_GEMMS}, not {choice!r}")
    if choice == "onednn" and not onednn_available():
        raise ValueError("cpu_gemm 'onednn': this torch build has no oneDNN linear operator")
    _cpu_gemm = choice


def cpu_gemm_setting() -> str:
    """The setting itself (``"auto"`` included), to restore later."""
    return _cpu_gemm


def cpu_gemm() -> str:
    """The library fp32 CPU inference products run on now: "blas" or "onednn"."""
    return auto_cpu_gemm() if _cpu_gemm == "auto" else _cpu_gemm


def linear_library(invariant: bool) -> str:
    """The library a :class:`Linear`'s fp32 CPU product runs on: :func:`cpu_gemm`'s, or oneDNN in
    batch-invariant mode (see :data:`INVARIANT_ROWS`; BLAS where torch has no oneDNN)."""
    return "onednn" if invariant and onednn_available() else cpu_gemm()


#: Rows a product is padded to in batch-invariant mode, whose products run as fp32 products on oneDNN
#: whatever :func:`cpu_gemm` says (bf16 ones too, upcast): a row of oneDNN's fp32 ``x @ W.T`` does
#: not depend on the row count from 2 rows on (checked up to 8192 rows at 1 and 2 threads on an AMD
#: EPYC, up to 4200 on an Intel Xeon, and over 20 random inputs of ``down_proj``'s shape there).
#: MKL's fp32 rows do on that Xeon at 2 threads (``down_proj``'s 1024-wide inner dimension from 57
#: rows on: its threads split the sum) and move below 16 rows elsewhere, and so do oneDNN's native
#: bf16 rows with AMX (``down_proj``'s shape at 56-128 rows, for 11 of 20 random inputs)
#: (docs/design.md, "Alone or batched"). Not 2: with 2 the batch-invariant tests fail on that Xeon
#: (something else in the step, e.g. attention's batched matmuls on BLAS, moves between 2 and 16 rows).
INVARIANT_ROWS = 16


# Batch-invariant mode is a property of the forward being run, not of the weights: several
# engines may share one model, each in its own mode (the engine thread sets it per step).
_invariant_rows: ContextVar[int] = ContextVar("leyline_invariant_rows", default=0)


@contextmanager
def invariant_products(on: bool = True) -> Iterator[None]:
    """Within this block (in this thread), products over a step's rows are padded to
    :data:`INVARIANT_ROWS` rows: a row's result does not depend on how many rows share it."""
    token = _invariant_rows.set(INVARIANT_ROWS if on else 0)
    try:
        yield
    finally:
        _invariant_rows.reset(token)


def invariant_rows() -> int:
    """Rows every product is padded to now (0: no padding, the default)."""
    return _invariant_rows.get()


def padded_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended along dim 0 up to ``rows`` (itself if it has as many)."""
    if x.shape[0] >= rows:
        return x
    return torch.cat((x, x.new_zeros(rows - x.shape[0], *x.shape[1:])))


@dataclass(frozen=True, eq=False)
class WeightKey:
    """What a cached copy of a weight is valid for: that tensor object (a weak reference, so a replaced
    weight whose memory is reused does not match), its storage and its in-place version."""

    tensor: weakref.ref
    data_ptr: int
    version: int

    @classmethod
    def of(cls, w: torch.Tensor) -> "WeightKey":
        return cls(weakref.ref(w), w.data_ptr(), w._version)

    def matches(self, w: torch.Tensor) -> bool:
        # identity, never ==: two live tensors compare elementwise
        return self.tensor() is w and self.data_ptr == w.data_ptr() and self.version == w._version


class Linear(nn.Linear):
    """``nn.Linear``; fp32 CPU inference runs on the GEMM library of :func:`cpu_gemm` (on oneDNN in
    batch-invariant mode), and bf16 CPU inference on oneDNN with a packed weight or as an fp32 GEMM.

    Without bf16 instructions oneDNN emulates bf16 GEMMs at a fraction of the fp32 speed, so there
    (and in batch-invariant mode, see :data:`INVARIANT_ROWS`) a bf16 product runs as an fp32 one:
    the operands upcast exactly (bf16 is a subset of fp32) and the product accumulates in fp32 as a
    bf16 GEMM does; the output rounds to bf16 as usual, so only the order of the sums differs. With
    bf16 instructions the weight is kept packed in oneDNN's blocked layout (see
    :meth:`_bf16_product`). Either copy costs the weight's size again, is made on first use and
    renewed whenever the weight changes (replaced, or updated in place under ``torch.no_grad()``; a
    write through ``weight.data`` is not seen) and dropped when the module moves (``.to()``).

    In batch-invariant mode (:func:`invariant_products`) a 2-D input with fewer
    rows is padded to :data:`INVARIANT_ROWS`, so every row's result is the same
    however many rows share the product.
    """

    _fp32: tuple[WeightKey, torch.Tensor] | None = None
    _packed: tuple[WeightKey, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = invariant_rows()
        if rows and x.dim() == 2 and x.shape[0] < rows:
            return self._product(padded_rows(x, rows))[: x.shape[0]]
        return self._product(x)

    def _apply(self, fn, *args, **kwargs):
        self._fp32 = self._packed = None  # copies of the weight as it was
        return super()._apply(fn, *args, **kwargs)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type != "cpu" or not x.numel() or x.dtype not in (torch.float32, torch.bfloat16)
                or (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):  # autograd's
            return super().forward(x)
        if x.dtype == torch.float32:
            return fp32_linear(x, self.weight, self.bias)
        if cpu_has_bf16_matmul() and not invariant_rows():
            return self._bf16_product(x) if onednn_available() else super().forward(x)
        bias = None if self.bias is None else self.bias.float()
        return fp32_linear(x.float(), self._fp32_weight(), bias).to(x.dtype)

    def _bf16_product(self, x: torch.Tensor) -> torch.Tensor:
        """A bf16 product on a CPU with bf16 instructions: oneDNN with the weight packed once into its
        blocked layout. ``F.linear`` repacks it on every call, which took half the time of a 1-16-row
        product on a Xeon with AMX; the results are the same bit for bit (tested)."""
        if self._packed is None or not self._packed[0].matches(self.weight):
            # the row count (16, a decode step's) is a layout hint only: every row count gives F.linear's result
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().contiguous(), 16)
            self._packed = (WeightKey.of(self.weight), packed)
        flat = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(flat, self._packed[1], self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def _fp32_weight(self) -> torch.Tensor:
        if self._fp32 is None or not self._fp32[0].matches(self.weight):
            self._fp32 = (WeightKey.of(self.weight), self.weight.detach().float())
        return self._fp32[1]


def fp32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """An fp32 product on :func:`linear_library`'s library; ``F.linear`` where autograd needs it
    (oneDNN's operator has no backward) or off the CPU (it is CPU-only)."""
    needs_grad = torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)
    if not needs_grad and x.device.type == "cpu" and linear_library(bool(invariant_rows())) == "onednn":
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def onednn_rows(rows: int) -> int:
    """``rows`` rounded up to one of about eight sizes per power of two (at most 12.5% more).

    oneDNN builds a kernel per product shape and keeps 1024 of them: a server whose steps bring ever
    new row counts would rebuild them without end (400 row counts x 6 of this model's shapes, twice:
    10.5 s against MKL's 9.8 s; rounded up like this, 4.7 s).
    """
    step = 1 << max(0, rows.bit_length() - 4)
    return -(-rows // step) * step


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` on oneDNN, the rows padded to :func:`onednn_rows` (a row's result does not
    depend on the rows beside it: see INVARIANT_ROWS)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    padded = onednn_rows(rows)
    if padded != rows:
        flat = torch.cat((flat, flat.new_zeros(padded - rows, flat.shape[1])))
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out[:rows].reshape(*x.shape[:-1], weight.shape[0])


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Top-k expert choice; returns (weights [N, k], expert ids [N, k])."""

    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.cfg = cfg
        n = cfg.n_routed_experts
        self.weight = nn.Parameter(torch.zeros(n, cfg.hidden_size))
        if cfg.scoring_func == "sigmoid":
            self.register_buffer("e_score_correction_bias", torch.zeros(n))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = fp32_linear(padded_rows(x.float(), invariant_rows()), self.weight.float())[: x.shape[0]]
        if cfg.scoring_func == "sigmoid":
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias.float()
            # V3: a group's score is the sum of its two best experts.
            group_scores = self._grouped(choice).topk(min(2, choice.shape[-1] // cfg.n_group), dim=-1)[0].sum(-1)
            choice = self._mask_groups(choice, group_scores, float("-inf"))
            ids = choice.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
        else:
            scores = logits.softmax(dim=-1, dtype=torch.float32)
            if cfg.topk_method == "group_limited_greedy":
                group_scores = self._grouped(scores).max(dim=-1).values
                scores = self._mask_groups(scores, group_scores, 0.0)
            weights, ids = scores.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)
        if cfg.norm_topk_prob and cfg.num_experts_per_tok > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, ids

    def _grouped(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.view(scores.shape[0], self.cfg.n_group, -1)

    def _mask_groups(self, scores: torch.Tensor, group_scores: torch.Tensor, fill: float) -> torch.Tensor:
        keep = group_scores.topk(self.cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0)
        mask = group_mask.unsqueeze(-1).expand_as(self._grouped(scores)).reshape_as(scores)
        return scores.masked_fill(mask == 0, fill)


class MoE(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts))
        self.shared_experts = (
            MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
            if cfg.n_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, ids = self.gate(flat)
        out = torch.zeros_like(flat)
        for expert_id in ids.unique().tolist():
            token_idx, slot = torch.where(ids == expert_id)
            y = self.experts[expert_id](flat[token_idx]) * weights[token_idx, slot, None].to(flat.dtype)
            out.index_add_(0, token_idx, y)
        out = out.view(shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
