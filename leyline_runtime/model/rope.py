"""Rotary embedding (half-split layout) with DeepSeek's YaRN.

``inv_freq`` is kept unit-magnitude and in float64; the YaRN attention factor
(which DeepSeek multiplies into cos/sin) is kept apart, because the δ-rotation
of cached keys must use plain cos/sin(δθ): the cached key already carries it.
"""

from __future__ import annotations

import math

import torch

from .config import MLAConfig, yarn_mscale


def inverse_frequencies(cfg: MLAConfig) -> torch.Tensor:
    """float64 [rope_dim/2], YaRN-blended when configured."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1.0 / pos_freqs
    rs = cfg.rope_scaling
    if rs is None:
        return extrapolation
    interpolation = 1.0 / (rs.factor * pos_freqs)
    low, high = _correction_range(rs.beta_fast, rs.beta_slow, dim, base,
                                  rs.original_max_position_embeddings, rs.truncate)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep_extrapolated = 1.0 - ramp
    return interpolation * (1 - keep_extrapolated) + extrapolation * keep_extrapolated


def attention_factor(cfg: MLAConfig) -> float:
    """Scale DeepSeek/transformers multiply into cos and sin under YaRN."""
    rs = cfg.rope_scaling
    if rs is None:
        return 1.0
    if rs.attention_factor is not None:
        return float(rs.attention_factor)
    if rs.mscale and rs.mscale_all_dim:
        return yarn_mscale(rs.factor, rs.mscale) / yarn_mscale(rs.factor, rs.mscale_all_dim)
    return yarn_mscale(rs.factor)


def _correction_range(beta_fast, beta_slow, dim, base, max_pos, truncate):
    def correction_dim(rotations: float) -> float:
        return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        inv_freq64 = inverse_frequencies(cfg)
        self.register_buffer("inv_freq64", inv_freq64, persistent=False)
        # transformers builds its fp32 inv_freq from fp32 arithmetic; matching that
        # keeps parity at 1e-5 on long positions.
        self.register_buffer("inv_freq", inv_freq64.float(), persistent=False)
        self.scale = attention_factor(cfg)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, rope_dim] (both halves) for integer positions [T]."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scale).to(dtype), (emb.sin() * self.scale).to(dtype)


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE in the half-split layout (dim i paired with i + D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
