"""Models to calibrate ``auto`` on beyond the 6-layer default: deeper stacks and other configs.

* ``default`` — the trained embedded model (6 layers).
* ``stack-12`` / ``stack-18`` — its trained layers repeated (0..5, 0..5, ...): the same
  weights, 2× / 3× as deep, so amortize's stale rows compound over more layers.
* ``v2-random`` / ``v3-random`` — tiny seeded DeepSeek-V2 (q-LoRA, YaRN) and V3 (MoE,
  sigmoid routing) configs over the default tokenizer, 8 layers (``v2-random-N`` /
  ``v3-random-N``: N layers). Random weights at the usual 0.02
  scale give near-uniform next-token distributions; :data:`SHARPEN` scales the linear
  weights so that the distributions, and so the drift, are not trivially flat.
"""

from __future__ import annotations

import copy

import torch

from leyline_runtime.model import DeepseekForCausalLM, MLAConfig, RopeScaling, load_model, seeded_model
from leyline_runtime.model.default import DEFAULT_MODEL_DIR

VARIANTS = ("default", "stack-12", "stack-18", "v2-random", "v3-random")
SHARPEN = 4.0  # linear weights
SHARPEN_EMBED = 10.0  # tied embeddings = output head: sets how peaked the logits are


def build(name: str, vocab_size: int) -> DeepseekForCausalLM:
    if name == "default":
        return load_model(str(DEFAULT_MODEL_DIR))
    if name.startswith("stack-"):
        return stacked(load_model(str(DEFAULT_MODEL_DIR)), int(name.split("-")[1]))
    family, _, layers = name.partition("-random")
    if family in ("v2", "v3") and (layers == "" or layers[1:].isdigit() and layers[0] == "-"):
        cfg = _v2(vocab_size) if family == "v2" else _v3(vocab_size)
        if layers:
            cfg.num_hidden_layers = int(layers[1:])
        return sharpened(seeded_model(cfg, seed=11 if family == "v2" else 12))
    raise ValueError(f"unknown model variant {name!r} (one of {', '.join(VARIANTS)}; "
                     f"v2-random-N / v3-random-N: N layers)")


def stacked(base: DeepseekForCausalLM, num_layers: int) -> DeepseekForCausalLM:
    """``base``'s layers repeated in order up to ``num_layers`` (all dense, as the base)."""
    cfg = copy.deepcopy(base.config)
    if any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)):
        raise ValueError("stacking is for dense models")
    depth = cfg.num_hidden_layers
    cfg.num_hidden_layers = num_layers
    cfg.first_k_dense_replace = num_layers
    model = DeepseekForCausalLM(cfg).to(base.dtype)
    state = {}
    for key, value in base.state_dict().items():
        if key.startswith("model.layers."):
            i, rest = key[len("model.layers."):].split(".", 1)
            for j in range(int(i), num_layers, depth):
                state[f"model.layers.{j}.{rest}"] = value
        else:
            state[key] = value
    model.load_state_dict(state)
    return model.eval()


def sharpened(model: DeepseekForCausalLM, factor: float = SHARPEN,
              embed_factor: float = SHARPEN_EMBED) -> DeepseekForCausalLM:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(embed_factor if "embed" in name else factor)
    return model


def _v2(vocab: int) -> MLAConfig:
    return MLAConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                     num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                     v_head_dim=32, q_lora_rank=96, max_position_embeddings=8192, model_type="deepseek_v2",
                     rope_scaling=RopeScaling(factor=2.0, original_max_position_embeddings=4096,
                                              mscale=0.707, mscale_all_dim=0.707),
                     tie_word_embeddings=True)


def _v3(vocab: int) -> MLAConfig:
    return MLAConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                     num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
                     v_head_dim=32, max_position_embeddings=4096, model_type="deepseek_v3",
                     n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=128,
                     first_k_dense_replace=1, scoring_func="sigmoid", topk_method="noaux_tc",
                     routed_scaling_factor=2.5, tie_word_embeddings=True)
