"""How vLLM rotates a model's keys, read from vLLM's own rotary objects, or why it cannot be undone.

Moving a cached key from position ``p`` to ``p + delta`` is exact only when the
model's position encoding is one fixed rotation per position: angle
``p * inv_freq[j]`` for rotary pair ``j``, whatever the sequence length, the
same for every layer. :func:`rope_spec` takes the rotary object vLLM built for
the model (``get_rope`` memoizes every instance in ``_ROPE_DICT``; the model's
layers hold the same ones), reads its pairing (``is_neox_style``), its rotary
width (``rotary_dim``, partial rotary included) and its unit-magnitude inverse
frequencies for the scalings whose formula is known here (default, linear,
llama3, YaRN, DeepSeek-YaRN, NTK, dynamic NTK as vLLM fixes it at start), and
then checks them against the object's own ``cos_sin_cache``: a formula that
does not reproduce vLLM's table is refused, not trusted. Anything else
(M-RoPE, LongRoPE's length-switched factors, dual-chunk, several different
rotary embeddings in one model) raises :class:`UnsupportedModel` with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class UnsupportedModel(ValueError):
    """The model's cache cannot be spliced exactly; ``str(exc)`` says why (it becomes a fallback reason)."""


@dataclass(frozen=True)
class RopeSpec:
    rotary_dim: int  # rotated dims at the start of each key head (MLA: the k_pe width)
    pair_layout: str  # "half_split" (NeoX: j pairs with j + rotary_dim/2) or "interleaved" (GPT-J: 2j, 2j+1)
    inv_freq: torch.Tensor  # [rotary_dim / 2] float64, unit magnitude (no YaRN mscale)
    kind: str  # the vLLM class, for logs and docs


# Rotary classes whose angle is a fixed p * inv_freq, and how to get that inv_freq.
def _default(rope):
    return rope._compute_inv_freq(rope.base)


def _linear(rope):
    factors = list(rope.scaling_factors)
    if len(factors) != 1:
        raise UnsupportedModel(f"linear rope scaling with {len(factors)} factors (per-LoRA caches)")
    return rope._compute_inv_freq(rope.base) / factors[0]


def _yarn(rope):
    return rope._compute_inv_freq(rope.scaling_factor)


def _dynamic_ntk(rope):
    # vLLM fixes the dynamic base once at start (max_position_embeddings), as its cache does
    base = rope.base * ((rope.scaling_factor * rope.max_position_embeddings / rope.max_trained_positions)
                        - (rope.scaling_factor - 1)) ** (rope.rotary_dim / (rope.rotary_dim - 2))
    return rope._compute_inv_freq(base)


def _dynamic_ntk_alpha(rope):
    return rope._compute_inv_freq(rope.base * rope.scaling_alpha ** (rope.rotary_dim / (rope.rotary_dim - 2)))


INV_FREQ = {
    "RotaryEmbedding": _default,
    "Llama3RotaryEmbedding": _default,
    "NTKScalingRotaryEmbedding": _default,
    "LinearScalingRotaryEmbedding": _linear,
    "YaRNScalingRotaryEmbedding": _yarn,
    "DeepseekScalingRotaryEmbedding": _yarn,
    "DynamicNTKScalingRotaryEmbedding": _dynamic_ntk,
    "DynamicNTKAlphaRotaryEmbedding": _dynamic_ntk_alpha,
}

# Named refusals (the class is not a per-position rotation Leyline can undo).
REFUSED = {
    "MRotaryEmbedding": "M-RoPE (multimodal positions: several position ids per token)",
    "MRotaryEmbeddingInterleaved": "M-RoPE (multimodal positions: several position ids per token)",
    "Phi3LongRoPEScaledRotaryEmbedding": "LongRoPE (its frequencies switch with the sequence length)",
    "DualChunkRotaryEmbedding": "dual-chunk attention rope (positions depend on the chunk)",
}


def model_rotary_embeddings() -> list:
    """The rotary objects vLLM built in this process (the model's layers hold these instances)."""
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT

    return list(_ROPE_DICT.values())


def rope_spec(ropes: list) -> RopeSpec:
    """The one rotation every layer of the model applies (``ropes``: :func:`model_rotary_embeddings`)."""
    if not ropes:
        raise UnsupportedModel("the model has no rotary position embedding (nothing to rotate; not verified)")
    specs = [_one_spec(r) for r in ropes]
    first = specs[0]
    for other in specs[1:]:
        if (other.rotary_dim, other.pair_layout) != (first.rotary_dim, first.pair_layout) or \
                not torch.equal(other.inv_freq, first.inv_freq):
            raise UnsupportedModel(f"the model uses {len(specs)} different rotary embeddings "
                                   f"({', '.join(sorted({s.kind for s in specs}))}); layers are not told apart")
    return first


def _one_spec(rope) -> RopeSpec:
    kind = type(rope).__name__
    for cls in type(rope).__mro__:
        if cls.__name__ in REFUSED:
            raise UnsupportedModel(f"{REFUSED[cls.__name__]}: {kind}")
    if kind not in INV_FREQ:
        raise UnsupportedModel(f"rotary embedding {kind} is not a verified per-position rotation")
    rotary_dim = int(rope.rotary_dim)
    if rotary_dim % 2:
        raise UnsupportedModel(f"odd rotary width {rotary_dim}")
    inv_freq = INV_FREQ[kind](rope).detach().to("cpu", torch.float64).reshape(-1)
    if inv_freq.numel() != rotary_dim // 2:
        raise UnsupportedModel(f"{kind}: {inv_freq.numel()} frequencies for rotary width {rotary_dim}")
    spec = RopeSpec(rotary_dim, "half_split" if rope.is_neox_style else "interleaved", inv_freq, kind)
    _check_against_cache(rope, spec)
    return spec


def _check_against_cache(rope, spec: RopeSpec) -> None:
    """The frequencies must reproduce vLLM's own cos/sin table (its attention scale aside)."""
    cache = getattr(rope, "cos_sin_cache", None)
    if not isinstance(cache, torch.Tensor) or cache.dim() != 2 or cache.shape[-1] != spec.rotary_dim:
        raise UnsupportedModel(f"{spec.kind} has no cos/sin table to check its frequencies against")
    table = cache.detach().to("cpu", torch.float64)
    half = spec.rotary_dim // 2
    scale = float(table[0, 0])  # cos(0) * attention scale (YaRN's mscale; 1 elsewhere)
    positions = [p for p in (1, 2, 3, 17, 255, 1023, table.shape[0] - 1) if p < table.shape[0]]
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * spec.inv_freq[None, :]
    # vLLM builds its table from fp32 angles: allow their rounding, and the table's own dtype
    tol = 4e-7 * float(angles.abs().max()) + 4 * torch.finfo(cache.dtype).eps + 1e-6
    want = torch.cat((torch.cos(angles), torch.sin(angles)), dim=-1) * scale
    worst = float((table[positions] - want).abs().max())
    if not math.isfinite(worst) or worst > tol * max(1.0, abs(scale)) or abs(float(table[0, half])) > tol:
        raise UnsupportedModel(f"{spec.kind}: the frequencies read do not reproduce vLLM's cos/sin table "
                               f"(max error {worst:.2e} > {tol:.2e})")
