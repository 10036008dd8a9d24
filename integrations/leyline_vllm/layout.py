"""Where ``k_pe`` sits in vLLM's MLA cache rows and how it is rotated.

An MLA cache row is ``[c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]``. The
rope part is stored already rotated; its pair layout and its inverse
frequencies are read from vLLM's own rotary object for the model
(``get_rope`` with the model's parameters, as ``deepseek_v2.py`` builds it),
so YaRN-blended frequencies come out exactly as vLLM applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class UnsupportedModel(ValueError):
    pass


@dataclass(frozen=True)
class RopeLayout:
    rope_offset: int  # first k_pe column (= kv_lora_rank)
    rope_dim: int
    pair_layout: str  # "interleaved" (vLLM's DeepSeek rotary) or "half_split"
    inv_freq: torch.Tensor  # [rope_dim / 2], unit magnitude (no mscale)


def rope_layout(vllm_config) -> RopeLayout:
    from vllm.model_executor.layers.rotary_embedding import get_rope

    hf = vllm_config.model_config.hf_text_config
    kv_lora_rank = getattr(hf, "kv_lora_rank", None)
    rope_dim = getattr(hf, "qk_rope_head_dim", None)
    if not kv_lora_rank or not rope_dim:
        raise UnsupportedModel(
            "Leyline's vLLM connector splices MLA caches (DeepSeek-V2/V3 family: kv_lora_rank + qk_rope_head_dim); "
            f"{type(hf).__name__} has none")
    params = dict(getattr(hf, "rope_parameters", None) or {"rope_type": "default"})
    if params.get("rope_type", "default") not in ("default", "deepseek_yarn", "deepseek_llama_scaling"):
        params["rope_type"] = (  # what DeepseekV2MLAAttention does before get_rope
            "deepseek_llama_scaling" if params.get("attention_factor") == 1.0 else "deepseek_yarn")
    rope = get_rope(rope_dim, max_position=hf.max_position_embeddings, rope_parameters=params,
                    is_neox_style=False)
    factor = getattr(rope, "scaling_factor", None)
    inv_freq = rope._compute_inv_freq(factor if factor is not None else rope.base)
    return RopeLayout(
        rope_offset=kv_lora_rank,
        rope_dim=rope_dim,
        pair_layout="half_split" if rope.is_neox_style else "interleaved",
        inv_freq=inv_freq.to(torch.float64).cpu(),
    )
