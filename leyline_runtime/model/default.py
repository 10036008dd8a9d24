"""The embedded default model: ``leyline_runtime/default_model/``.

That folder is package data: ``config.json`` + ``model.safetensors`` +
``tokenizer.json`` (the trained model, see ``leyline-train train``). Where
only the tokenizer is present the seeded random model of the default
config is built instead, so the runtime always starts offline
(:func:`.loader.load_model` with no path does that; this module never imports the loader).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .config import MLAConfig
from .deepseek import DeepseekForCausalLM

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "default_model"
DEFAULT_SEED = 0


def default_config(vocab_size: int) -> MLAConfig:
    # v_head_dim == qk_head_dim keeps CPU SDPA on its fast path.
    return MLAConfig(
        vocab_size=vocab_size, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
        num_attention_heads=6, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, rope_interleave=False,
        tie_word_embeddings=True,
    )


def seeded_model(cfg: MLAConfig, seed: int = DEFAULT_SEED) -> DeepseekForCausalLM:
    """Deterministic random init (std 0.02 linears, unit norms)."""
    gen = torch.Generator().manual_seed(seed)
    model = DeepseekForCausalLM(cfg)
    for name, p in sorted(model.named_parameters()):
        if p.dim() >= 2:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


def default_tokenizer_path() -> Path:
    return DEFAULT_MODEL_DIR / "tokenizer.json"
