"""DeepSeek-V2/V3 causal LM in plain torch, with Hugging Face parameter names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attention import MLAttention
from .batch import BatchLayout
from .config import MLAConfig
from .layers import MLP, Linear, MoE, RMSNorm
from .rope import RotaryEmbedding


@dataclass(frozen=True)
class CacheLayout:
    """What one cached row per (layer, token) holds, for the directive executor.

    Columns outside the rotary slices are position-free and move by copy; each
    rotary slice (half-split pairs) moves by a rotation of δ·inv_freq.
    """

    num_layers: int
    row_width: int
    rotary_slices: tuple[tuple[int, int], ...]  # (offset, width)
    inv_freq: torch.Tensor | None  # float64, unit magnitude; None: no closed-form kernel


class DecoderLayer(nn.Module):
    def __init__(self, cfg: MLAConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(index) else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_batch(self, x, cos, sin, pool, layout: BatchLayout):
        x = x + self.self_attn.forward_batch(self.input_layernorm(x), cos, sin, pool, layout)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekModel(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DeepseekForCausalLM(nn.Module):
    def __init__(self, config: MLAConfig):
        super().__init__()
        self.config = config
        self.model = DeepseekModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def cache_layout(self) -> CacheLayout:
        cfg = self.config
        return CacheLayout(
            num_layers=cfg.num_hidden_layers,
            row_width=cfg.kv_lora_rank + cfg.qk_rope_head_dim,
            rotary_slices=((cfg.kv_lora_rank, cfg.qk_rope_head_dim),),
            inv_freq=self.rotary.inv_freq64,
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward with no cache: [B, T] -> logits [B, T, vocab]."""
        T = input_ids.shape[-1]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(torch.arange(T, device=input_ids.device), x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    @torch.no_grad()
    def forward_batch(self, input_ids: torch.Tensor, pool: torch.Tensor, layout: BatchLayout) -> torch.Tensor | None:
        """Run the tokens [N] of a batch of sequences against the paged cache ``pool`` [L, rows, width].

        Writes every token's rows (``layout.write_rows``) and returns fp32
        logits [len(layout.logit_rows), vocab] of the wanted rows (None: none wanted).
        """
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(layout.positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer.forward_batch(x, cos, sin, pool[i], layout)
        if not len(layout.logit_rows):
            return None
        return self.lm_head(self.model.norm(x[layout.logit_rows])).float()
