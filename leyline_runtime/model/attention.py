"""Multi-head latent attention (DeepSeek-V2/V3).

Two paths share the weights:

* ``forward`` — the plain causal forward, shaped like the reference
  implementation (per-head keys/values expanded from the latent).
* ``forward_batch`` — the serving path over a paged cache of rows
  ``[c_kv | k_pe]`` (one row of ``kv_lora_rank + qk_rope_head_dim`` per token
  and layer), for a batch of sequences. Decode steps absorb ``kv_b_proj``
  into the query and the output (MQA over the latent); long prefill runs
  expand the keys per head once, where that is cheaper. Short prefill runs
  of several sequences attend as one group over a padded gather of their
  rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batch import BatchLayout, GatherGroup, PrefillSegment, read_rows
from .config import MLAConfig
from .layers import Linear, RMSNorm, invariant_rows, padded_rows
from .rope import rotate_half_split


class MLAttention(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.cfg = cfg
        h, H = cfg.hidden_size, cfg.num_attention_heads
        self.num_heads = H
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(h, H * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(h, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank)
            self.q_b_proj = Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                            bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = Linear(H * cfg.v_head_dim, h, bias=cfg.attention_bias)
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

    def forward_batch(self, x: torch.Tensor, cos, sin, pool: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        """x [N, hidden]: the tokens of every sequence in the batch (see :class:`BatchLayout`).

        Writes the tokens' rows first, so a segment sees the rows written in
        this same layer by the segments of its sequence before it.
        """
        cfg = self.cfg
        q_nope, q_pe = self._queries(x, cos, sin)
        new_rows = self.latent(x, cos, sin).to(pool.dtype)
        pool[layout.write_rows] = new_rows
        new_rows = new_rows.to(x.dtype)
        out = x.new_empty(x.shape[0], self.num_heads * cfg.v_head_dim)
        for seg in layout.prefills:
            t = seg.tokens
            out[t] = self._prefill_attention(q_nope[t], q_pe[t], new_rows[t], pool, seg)
        if layout.decodes:
            d = layout.decode_tokens
            out[d] = self._decode_attention(q_nope[d], q_pe[d], pool, layout)
        for group in layout.groups:
            t = group.tokens
            out[t] = self._grouped_attention(q_nope[t], q_pe[t], pool, group)
        return self.o_proj(out)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj split per head: w_uk [H, nope, r], w_uv [H, v, r]."""
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(self.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        return w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim:]

    def _decode_attention(self, q_nope, q_pe, pool, layout: BatchLayout) -> torch.Tensor:
        """One query per sequence at its last position: absorbed MQA over its latent rows read in place.

        The projections through ``kv_b_proj`` run for all sequences at once.
        """
        cfg = self.cfg
        B, r = q_nope.shape[0], cfg.kv_lora_rank
        w_uk, w_uv = self._weights()
        # batch-invariant mode: products over the decode batch padded, each sequence's rows in one
        # tensor, so a sequence's result depends neither on its neighbours nor on where its blocks lie
        rows = invariant_rows()
        absorbed = torch.einsum("bhn,hnr->bhr", padded_rows(q_nope, rows), w_uk)[:B]
        q = torch.cat((absorbed, q_pe), dim=-1)  # [B, H, r + rope]
        latent = q.new_empty(B, self.num_heads, r)
        for b, step in enumerate(layout.decodes):
            latent[b] = self._latent_attention(q[b], self._read_rows(pool, step.rows))
        return torch.einsum("bhr,hvr->bhv", padded_rows(latent, rows), w_uv)[:B].reshape(B, -1)

    def _read_rows(self, pool: torch.Tensor, extents) -> list[torch.Tensor]:
        """A sequence's rows (see :func:`read_rows`); one part in batch-invariant mode."""
        return read_rows(pool, extents, 1) if invariant_rows() else read_rows(pool, extents)

    def _grouped_attention(self, q_nope, q_pe, pool, group: GatherGroup) -> torch.Tensor:
        """The group's n queries (q_nope [n, H, nope], q_pe [n, H, rope]) -> [n, H * v].

        Absorbed MQA: every member's query slots and heads are the rows of one
        product with its padded rows; the bias hides padding and the future.
        """
        cfg = self.cfg
        (S, Q, L), H, r = group.shape, self.num_heads, cfg.kv_lora_rank
        w_uk, w_uv = self._weights()
        q = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe), dim=-1)  # [n, H, r + rope]
        q = q[group.slots].transpose(1, 2).reshape(S, H * Q, -1)  # [S, H * Q, r + rope]
        rows = group.read(pool).to(q.dtype)  # [S, L, r + rope]
        scores = (q @ rows.transpose(1, 2)).float().view(S, H, Q, L) * self.scale + group.bias
        probs = scores.softmax(dim=-1).to(q.dtype).view(S, H * Q, L)
        latent = (probs @ rows[..., :r]).view(S, H, Q, r).transpose(1, 2).reshape(S * Q, H, r)[group.real]
        return torch.einsum("thr,hvr->thv", latent, w_uv).flatten(1)

    def _latent_attention(self, q: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
        """q [H, r + rope] over the rows of ``parts`` -> [H, r]; V is the row's latent (its first r columns)."""
        r = self.cfg.kv_lora_rank
        parts = [p.to(q.dtype) for p in parts]
        scores = torch.cat([q @ p.T for p in parts], dim=-1).float() * self.scale
        probs = scores.softmax(dim=-1).to(q.dtype)
        out, at = None, 0
        for p in parts:
            term = probs[:, at: at + p.shape[0]] @ p[:, :r]
            out = term if out is None else out + term
            at += p.shape[0]
        return out

    def _prefill_attention(self, q_nope, q_pe, own_rows, pool, seg: PrefillSegment) -> torch.Tensor:
        """Causal attention of a run of T queries at positions start.. over rows 0..start+T.

        The rows before ``start`` (read where they lie in the pool) and the
        run's own rows are two attention parts merged by their log-sum-exp,
        so no mask is ever built: the own part is plain causal.
        """
        T = q_nope.shape[0]
        out, lse = self._attend(q_nope, q_pe, own_rows, causal=True)
        if seg.start > 0:
            for part in self._read_rows(pool, seg.prefix):
                out, lse = _merge(out, lse, *self._attend(q_nope, q_pe, part.to(q_nope.dtype), causal=False))
        return out.reshape(T, -1)

    def _attend(self, q_nope, q_pe, kv, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (out [T, H, v], lse [T, H]) for T queries over the rows kv (causal: square, same positions)."""
        cfg = self.cfg
        T, Tk = q_nope.shape[0], kv.shape[0]
        # Absorbed (MQA over the latent, head size r + rope) skips expanding the
        # keys through kv_b_proj; that expansion pays off once enough queries share it.
        absorbed_cost = T * 2 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        expanded_cost = cfg.kv_lora_rank * (cfg.qk_nope_head_dim + cfg.v_head_dim) + T * 2 * cfg.qk_head_dim
        if absorbed_cost <= expanded_cost:
            return self._absorbed(q_nope, q_pe, kv, causal)
        return self._expanded(q_nope, q_pe, kv, causal, T, Tk)

    def _absorbed(self, q_nope, q_pe, kv, causal):
        cfg = self.cfg
        T, H, r = q_nope.shape[0], self.num_heads, cfg.kv_lora_rank
        w_uk, w_uv = self._weights()
        q = torch.cat((torch.einsum("thn,hnr->htr", q_nope, w_uk), q_pe.transpose(0, 1)), dim=-1)  # [H, T, r+rope]
        if causal:
            k = kv[None].expand(H, *kv.shape)[None]
            out, lse = _sdpa_lse(q[None], k, k, True, self.scale)  # [1, H, T, .], [1, H, T]
        else:  # heads folded into the query rows: one MQA product
            out, lse = _sdpa_lse(q.reshape(1, 1, H * T, -1), kv[None, None], kv[None, None], False, self.scale)
        out, lse = out.reshape(H, T, -1)[..., :r], lse.reshape(H, T)
        return torch.einsum("htr,hvr->thv", out, w_uv), lse.transpose(0, 1)

    def _expanded(self, q_nope, q_pe, kv, causal, T, Tk):
        cfg = self.cfg
        H = self.num_heads
        c_kv, k_pe = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        k_nope, v = self.kv_b_proj(c_kv).view(Tk, H, -1).split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1)[None]
        k = torch.cat((k_nope, k_pe[:, None, :].expand(Tk, H, cfg.qk_rope_head_dim)), dim=-1).transpose(0, 1)[None]
        v = v.transpose(0, 1)[None]
        # CPU SDPA leaves its fast path when V's head size differs from Q/K's:
        # zero columns change no product.
        width = max(cfg.qk_head_dim, cfg.v_head_dim)
        q, k, v = (F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))
        out, lse = _sdpa_lse(q, k, v, causal, self.scale)
        return out[0, ..., : cfg.v_head_dim].transpose(0, 1), lse[0].transpose(0, 1)


def _sdpa_lse(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and its log-sum-exp per query row (fp32)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse.float()
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    return ((scores - lse[..., None]).exp() @ v.float()).to(q.dtype), lse


def _merge(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from its parts (out [T, H, v], lse [T, H])."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp(), (lse_b - top).exp()
    total = w_a + w_b
    out = (out_a.float() * w_a[..., None] + out_b.float() * w_b[..., None]) / total[..., None]
    return out.to(out_a.dtype), top + total.log()
