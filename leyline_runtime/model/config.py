"""MLA model configuration, read from a Hugging Face ``config.json``.

Two dialects exist: the original DeepSeek one (``rope_scaling`` with ``type``,
``scoring_func``/``topk_method``) and the transformers one (``rope_parameters``
with ``rope_type``). Both normalise to :class:`MLAConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


class UnsupportedConfig(ValueError):
    """A config field this runtime cannot serve; the message names the field."""


@dataclass
class RopeScaling:
    type: str = "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass
class MLAConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    # Layout of the rope dims in the checkpoint's weights. The runtime always
    # computes in the half-split layout; interleaved weights are reordered at load.
    rope_interleave: bool = False
    model_type: str = "deepseek_v3"
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    # MoE (n_routed_experts None = dense everywhere)
    n_routed_experts: int | None = None
    n_shared_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_routed_experts is not None and layer >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (DeepSeek)."""
        scale = self.qk_head_dim ** -0.5
        rs = self.rope_scaling
        if rs is not None and rs.mscale_all_dim:
            m = yarn_mscale(rs.factor, rs.mscale_all_dim)
            scale *= m * m
        return scale

    def to_hf_dict(self) -> dict[str, Any]:
        """transformers-style ``config.json`` (DeepseekV3ForCausalLM loads it)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("rope_scaling", "extra")}
        d["architectures"] = ["DeepseekV3ForCausalLM" if self.model_type == "deepseek_v3"
                              else "DeepseekV2ForCausalLM"]
        params: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rs = dataclasses.asdict(self.rope_scaling)
            params.update({k: v for k, v in rs.items() if v is not None and k != "type"})
            params["rope_type"] = self.rope_scaling.type
        d["rope_parameters"] = params
        d["hidden_act"] = "silu"
        d["num_key_value_heads"] = self.num_attention_heads
        d["head_dim"] = self.qk_rope_head_dim
        if self.n_routed_experts is None:
            # transformers builds MoE for layers >= first_k_dense_replace: keep all dense.
            d["first_k_dense_replace"] = self.num_hidden_layers
            d["n_routed_experts"] = 1
            d["moe_intermediate_size"] = 1
        d["num_nextn_predict_layers"] = 0
        d.update(self.extra)
        return d


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


_SUPPORTED_TYPES = {"deepseek_v2", "deepseek_v3"}


def config_from_dict(raw: dict[str, Any]) -> MLAConfig:
    model_type = raw.get("model_type")
    if model_type is None:
        archs = " ".join(raw.get("architectures") or [])
        model_type = "deepseek_v2" if "V2" in archs else "deepseek_v3" if "V3" in archs else None
    if model_type not in _SUPPORTED_TYPES:
        raise UnsupportedConfig(
            f"model_type={model_type!r} is not supported (expected one of {sorted(_SUPPORTED_TYPES)})")

    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedConfig(f"hidden_act={act!r} is not supported (only 'silu')")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim"):
        value = raw.get(name)
        if not isinstance(value, int) or value <= 0:
            raise UnsupportedConfig(f"{name}={value!r} must be a positive integer")
    if raw["qk_rope_head_dim"] % 2:
        raise UnsupportedConfig(f"qk_rope_head_dim={raw['qk_rope_head_dim']} must be even")
    if raw.get("moe_layer_freq", 1) != 1:
        raise UnsupportedConfig(f"moe_layer_freq={raw['moe_layer_freq']!r} is not supported (only 1)")
    if raw.get("mlp_bias"):
        raise UnsupportedConfig("mlp_bias=true is not supported")

    rope_theta, rope_scaling = _rope(raw)
    is_v3 = model_type == "deepseek_v3"
    n_routed = raw.get("n_routed_experts") or raw.get("num_experts")
    first_dense = int(raw.get("first_k_dense_replace", 0) or 0)
    if n_routed and first_dense >= raw["num_hidden_layers"]:
        n_routed = None  # every layer dense
    cfg = MLAConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=raw["num_attention_heads"],
        kv_lora_rank=raw["kv_lora_rank"],
        qk_nope_head_dim=raw["qk_nope_head_dim"],
        qk_rope_head_dim=raw["qk_rope_head_dim"],
        v_head_dim=raw["v_head_dim"],
        q_lora_rank=raw.get("q_lora_rank") or None,
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        # V2 always pairs adjacent dims (complex multiply); V3 follows rope_interleave (default true).
        rope_interleave=True if not is_v3 else bool(raw.get("rope_interleave", True)),
        model_type=model_type,
        attention_bias=bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        n_routed_experts=n_routed or None,
        n_shared_experts=int(raw.get("n_shared_experts") or 0),
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 1),
        moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
        first_k_dense_replace=first_dense,
        scoring_func=raw.get("scoring_func", "sigmoid" if is_v3 else "softmax"),
        topk_method=raw.get("topk_method", "noaux_tc" if is_v3 else "greedy"),
        n_group=int(raw.get("n_group") or 1),
        topk_group=int(raw.get("topk_group") or 1),
        norm_topk_prob=bool(raw.get("norm_topk_prob", is_v3)),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
    )
    _check_moe(cfg)
    return cfg


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UnsupportedConfig(f"rope_scaling={params!r} must be an object")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind != "yarn":
        raise UnsupportedConfig(f"rope type {kind!r} is not supported (default or yarn)")
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    if original is None:
        raise UnsupportedConfig("rope_scaling.original_max_position_embeddings is required for yarn")
    if factor is None:
        factor = raw.get("max_position_embeddings", original) / original
    return theta, RopeScaling(
        type="yarn",
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


def _check_moe(cfg: MLAConfig) -> None:
    if cfg.n_routed_experts is None:
        return
    if cfg.scoring_func not in ("softmax", "sigmoid"):
        raise UnsupportedConfig(f"scoring_func={cfg.scoring_func!r} is not supported")
    if cfg.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise UnsupportedConfig(f"topk_method={cfg.topk_method!r} is not supported")
    if cfg.n_routed_experts % cfg.n_group:
        raise UnsupportedConfig(
            f"n_routed_experts={cfg.n_routed_experts} is not divisible by n_group={cfg.n_group}")
    if cfg.moe_intermediate_size <= 0:
        raise UnsupportedConfig("moe_intermediate_size must be positive for an MoE model")
