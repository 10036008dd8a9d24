"""How much arithmetic a prefill needs, and how fast this machine does such arithmetic at best.

A prefill's useful work is fixed by the model: the products every token goes
through and causal attention (each query against itself and the positions
before it). Dividing it by a time gives GFLOP/s, which says how close an
implementation runs to the machine, independently of the other arm. The two
ceilings are measured here, in the same process, dtype and thread count: one
large GEMM and one causal ``scaled_dot_product_attention`` at the model's
head sizes (the kernels both arms end up in).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from leyline_runtime.model.config import MLAConfig


def token_macs(cfg: MLAConfig, layer: int) -> int:
    """Multiply-adds of one token through layer ``layer``'s products (attention excluded)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    q_out = heads * cfg.qk_head_dim
    q = h * q_out if cfg.q_lora_rank is None else h * cfg.q_lora_rank + cfg.q_lora_rank * q_out
    kv_a = h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    kv_b = cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    o = heads * cfg.v_head_dim * h
    if cfg.is_moe_layer(layer):  # router + the experts a token goes through (routed top-k and shared)
        experts = cfg.num_experts_per_tok + cfg.n_shared_experts
        mlp = h * cfg.n_routed_experts + experts * 3 * h * cfg.moe_intermediate_size
    else:
        mlp = 3 * h * cfg.intermediate_size
    return q + kv_a + kv_b + o + mlp


def prefill_flops(cfg: MLAConfig, n: int, logits_rows: int = 1) -> dict[str, float]:
    """FLOPs of prefilling ``n`` tokens from an empty cache: the layers' ``products``, causal
    ``attention`` (QK^T and PV over the n(n+1)/2 visible pairs per head), ``logits_rows`` rows of
    the LM ``head``, and their ``total``."""
    layers = range(cfg.num_hidden_layers)
    products = 2 * n * sum(token_macs(cfg, layer) for layer in layers)
    pairs = n * (n + 1) // 2
    attention = 2 * pairs * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * cfg.num_hidden_layers
    head = 2 * logits_rows * cfg.hidden_size * cfg.vocab_size
    return {"products": float(products), "attention": float(attention), "head": float(head),
            "total": float(products + attention + head)}


def _best_seconds(fn, reps: int) -> float:
    fn()  # first call pays one-time costs
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def gemm_ceiling(dtype: torch.dtype, size: int = 2048, reps: int = 3) -> float:
    """GFLOP/s of one ``size``-cubed GEMM, best of ``reps``."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(dtype)
    b = torch.randn(size, size, generator=g).to(dtype)
    return 2 * size ** 3 / _best_seconds(lambda: a @ b, reps) / 1e9


def sdpa_ceiling(cfg: MLAConfig, dtype: torch.dtype, context: int, reps: int = 2) -> float:
    """GFLOP/s of one layer's causal SDPA over ``context`` tokens with the model's heads and QK head
    size, best of ``reps`` (the kernel's rate depends on the length, so each context gets its own).
    V is the QK size too, and only the model's own V size counts as useful work: for a model with a
    smaller V this is Leyline's padded call, not necessarily the kernel transformers takes (the
    default model's V and QK sizes are equal)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, cfg.num_attention_heads, context, cfg.qk_head_dim, generator=g).to(dtype)
               for _ in range(3))
    useful = 2 * context * (context + 1) // 2 * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim)
    return useful / _best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps) / 1e9


def bound_seconds(flops: dict[str, float], ceilings: dict[str, float]) -> float:
    """The least time the work could take at the ceilings: products and LM head at the GEMM's rate,
    attention at causal SDPA's (a loose bound for small products, which run below a large GEMM's rate)."""
    gemm = flops["products"] + flops["head"]
    return gemm / (ceilings["gemm_gflops"] * 1e9) + flops["attention"] / (ceilings["causal_sdpa_gflops"] * 1e9)
