"""Multi-head latent attention (DeepSeek-V2/V3).

Two paths share the weights:

* ``forward`` — the plain causal forward, shaped like the reference
  implementation (per-head keys/values expanded from the latent).
* ``forward_cached`` — the serving path over a paged cache of rows
  ``[c_kv | k_pe]``. It absorbs ``kv_b_proj`` into the query and the output
  (MQA over the latent), so a cached token costs one row of
  ``kv_lora_rank + qk_rope_head_dim`` per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import MLAConfig
from .layers import RMSNorm
from .rope import rotate_half_split


class MLAttention(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.cfg = cfg
        h, H = cfg.hidden_size, cfg.num_attention_heads
        self.num_heads = H
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(h, H * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                            bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, h, bias=cfg.attention_bias)
        self.scale = cfg.softmax_scale

    # -- shared pieces -----------------------------------------------------------

    def _queries(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """q_nope [..., T, H, nope], q_pe [..., T, H, rope] (rotated)."""
        cfg = self.cfg
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(*x.shape[:-1], self.num_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        return q_nope, rotate_half_split(q_pe, cos.unsqueeze(-2), sin.unsqueeze(-2))

    def latent(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """Cache rows ``[c_kv | k_pe]`` for tokens x: normalised latent and rotated rope key."""
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1)
        return torch.cat((self.kv_a_layernorm(c_kv), rotate_half_split(k_pe, cos, sin)), dim=-1)

    # -- plain causal forward ----------------------------------------------------

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        H = self.num_heads
        q_nope, q_pe = self._queries(x, cos, sin)
        rows = self.latent(x, cos, sin)
        c_kv, k_pe = rows.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(c_kv).view(B, T, H, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)
        k = torch.cat((k_nope, k_pe[:, :, None, :].expand(B, T, H, cfg.qk_rope_head_dim)), dim=-1).transpose(1, 2)
        v = v.transpose(1, 2)
        pad = cfg.qk_head_dim - cfg.v_head_dim
        if pad > 0:  # CPU SDPA leaves its fast path when V's head size differs from Q/K's
            v = F.pad(v, (0, pad))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        out = out[..., : cfg.v_head_dim].transpose(1, 2).reshape(B, T, H * cfg.v_head_dim)
        return self.o_proj(out)

    # -- serving path over the paged cache --------------------------------------

    def forward_cached(self, x: torch.Tensor, cos, sin, positions: torch.Tensor,
                       pool: torch.Tensor, write_rows: torch.Tensor, read_rows: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] at ``positions``; ``read_rows[p]`` is the pool row of position p.

        Writes the new tokens' rows first, then attends over ``read_rows``
        (which must cover positions 0..max(positions)).
        """
        q_nope, q_pe = self._queries(x, cos, sin)
        pool[write_rows] = self.latent(x, cos, sin).to(pool.dtype)
        kv = pool[read_rows].to(x.dtype)  # [Tk, r + rope]
        mask = self._mask(positions, kv.shape[0])
        # Absorbed attention (MQA over the latent) is cheapest per query, but its
        # head size is r + rope; for many queries expanding keys per head wins.
        if x.shape[0] >= self.PREFILL_EXPAND_MIN:
            out = self._expanded_attention(q_nope, q_pe, kv, mask, x.shape[0] == kv.shape[0])
        else:
            out = self._absorbed_attention(q_nope, q_pe, kv, mask)
        return self.o_proj(out)

    PREFILL_EXPAND_MIN = 64

    @staticmethod
    def _mask(positions: torch.Tensor, Tk: int) -> torch.Tensor | None:
        if positions.shape[0] == 1 and int(positions[0]) == Tk - 1:
            return None  # one query at the end sees everything
        return torch.arange(Tk, device=positions.device)[None, :] <= positions[:, None]

    def _absorbed_attention(self, q_nope, q_pe, kv, mask) -> torch.Tensor:
        cfg = self.cfg
        T, H, r = q_nope.shape[0], self.num_heads, cfg.kv_lora_rank
        w = self.kv_b_proj.weight.view(H, cfg.qk_nope_head_dim + cfg.v_head_dim, r)
        w_uk, w_uv = w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim:]
        q_lat = torch.einsum("thn,hnr->htr", q_nope, w_uk)
        q = torch.cat((q_lat, q_pe.transpose(0, 1)), dim=-1).reshape(1, 1, H * T, -1)
        # Folding heads into the query rows makes this one MQA product; V is the
        # row itself (its k_pe tail only pads V to Q/K's size and is dropped).
        k = kv[None, None]
        out = F.scaled_dot_product_attention(q, k, k, attn_mask=None if mask is None else mask.repeat(H, 1),
                                             scale=self.scale)
        out = out.view(H, T, -1)[..., :r]
        return torch.einsum("htr,hvr->thv", out, w_uv).reshape(T, H * cfg.v_head_dim)

    def _expanded_attention(self, q_nope, q_pe, kv, mask, causal_square: bool) -> torch.Tensor:
        cfg = self.cfg
        T, H, Tk = q_nope.shape[0], self.num_heads, kv.shape[0]
        c_kv, k_pe = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        k_nope, v = self.kv_b_proj(c_kv).view(Tk, H, -1).split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1)[None]
        k = torch.cat((k_nope, k_pe[:, None, :].expand(Tk, H, cfg.qk_rope_head_dim)), dim=-1).transpose(0, 1)[None]
        v = v.transpose(0, 1)[None]
        pad = cfg.qk_head_dim - cfg.v_head_dim
        if pad > 0:
            v = F.pad(v, (0, pad))
        if causal_square:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out[0, ..., : cfg.v_head_dim].transpose(0, 1).reshape(T, H * cfg.v_head_dim)
