"""Amortize, forget and ``auto`` on a transformers model: the edit policies with transformers as the oracle.

The bundled runtime serves MLA only, so whether amortize drifts the same on a GQA model cannot be
measured through it. Here every policy is played on the model's own transformers implementation
(``LlamaForCausalLM``, ``DeepseekV3ForCausalLM``), whose per-layer cache the harness edits the way
the connectors do:

* ``forget``: keep the rows before the edit, prefill the rest of the edited history on them;
* ``amortize``: keep the rows before the edit, prefill the replacement on them, and move the rows
  after it by ``delta`` positions — the rotary dims of every cached key rotated by ``delta``
  (``leyline_kernels.rotate_and_splice``, angles in float64), everything else copied;
* ``auto``: amortize, then the runtime's rule (:mod:`leyline_runtime.directives.auto_mode`): forget
  a short tail; else measure the layer-1 change of the first ``signal_window`` rows after the edit
  (layer 0's rows are exact after the splice, so a pass over that window gives the layer-1 rows a
  forget would write), times ``num_layers - 1``: over ``forget_threshold`` forget, else add it to the
  session's drift and re-prefill from the earliest stale row once the drift passes the budget
  (:class:`leyline_runtime.auto_rule.DriftState`).

The cache rows are what each architecture caches: a Llama model K and V per KV head (rotary: all
``head_dim`` dims of K, NeoX half-split); transformers' DeepSeek-V3 the MLA latent (``c_kv`` as
"keys", the shared rope key as "values"), as the runtime caches it — so the layer-1 change is the
same quantity the runtime measures. One directive batch is spliced as one span: from the first token
that differs to the last (the batches of the agent-like sessions are one directive each, except a few
whose spans are adjacent).

After each edit the next tool round and an assistant header are prefilled on every policy's rows
and scored against a fresh prefill of the whole edited history (R): JSD per position and top-1
agreement; *probe*: the assistant header's position only. ``forget`` is checked against R on the
same positions (it must equal it to float error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from leyline_kernels import delta_rotation_table, rotate_and_splice
from leyline_runtime.auto_rule import AutoConfig, DriftState, moved_position, signal_choice, tail_is_short
from leyline_runtime.directives.executor import common_ends
from ..fidelity.policies import PolicyRun, jsd_rows

POLICIES = ("amortize", "forget", "auto")
Rows = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys [H, T, Dk], values [H, T, Dv])


@dataclass(frozen=True)
class RopeSlot:
    """Where a model's cache keeps the rotated dims: which tensor, which columns, which pairing."""

    tensor: int  # 0: keys, 1: values
    offset: int
    dim: int
    pair_layout: str
    inv_freq: torch.Tensor  # float64 [dim / 2]


def rope_slot(model) -> RopeSlot:
    """The rotary part of ``model``'s cached rows (a transformers Llama- or DeepSeek-V3-family model)."""
    cfg, rotary = model.config, model.model.rotary_emb
    if getattr(rotary, "attention_scaling", 1.0) != 1.0 or getattr(rotary, "rope_type", "default") != "default":
        raise ValueError("the oracle rotates with plain rope frequencies only (no scaled rope)")
    inv_freq = rotary.inv_freq.detach().to(torch.float64)
    if cfg.model_type == "deepseek_v3":
        if cfg.rope_interleave:
            raise ValueError("deepseek_v3 with rope_interleave caches a permuted rope key; not handled here")
        return RopeSlot(1, 0, cfg.qk_rope_head_dim, "half_split", inv_freq)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return RopeSlot(0, 0, 2 * inv_freq.numel(), "half_split", inv_freq) if 2 * inv_freq.numel() <= head_dim \
        else _bad(cfg)


def _bad(cfg):
    raise ValueError(f"{cfg.model_type}: rotary frequencies do not fit the head")


# --- cache rows --------------------------------------------------------------------------------


def take(rows: Rows, a: int, b: int) -> Rows:
    return [(k[:, a:b], v[:, a:b]) for k, v in rows]


def cat(*parts: Rows) -> Rows:
    parts = [p for p in parts if p and p[0][0].shape[1]]
    if len(parts) == 1:
        return parts[0]
    return [(torch.cat([p[i][0] for p in parts], 1), torch.cat([p[i][1] for p in parts], 1))
            for i in range(len(parts[0]))]


def length(rows: Rows) -> int:
    return rows[0][0].shape[1] if rows else 0


@torch.no_grad()
def prefill(model, ids: list[int], start: int, past: Rows, keep: int = 0) -> tuple[torch.Tensor, Rows]:
    """Logits of ``ids`` at positions ``start..`` over the rows ``past`` (of positions ``0..start``), and
    the rows the model wrote for them. ``keep``: logits of the last ``keep`` positions only (0: all); a
    real vocabulary's head over every position of a 3k-token prefill costs a third of the prefill and
    1.8 GB of fp32 logits, and the rows do not depend on it."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(past):
        cache.update(k[None].clone(), v[None].clone(), i)
    x = torch.tensor([ids], dtype=torch.long)
    positions = torch.arange(start, start + len(ids))[None]
    out = model(input_ids=x, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0].float(), [(layer.keys[0, :, start:], layer.values[0, :, start:]) for layer in cache.layers]


def moved(rows: Rows, delta: int, slot: RopeSlot) -> Rows:
    """``rows`` moved ``delta`` positions: the slot's rotary dims rotated, the rest copied."""
    if delta == 0 or not length(rows):
        return rows
    out = []
    for layer in rows:
        src = layer[slot.tensor]  # [H, T, D]
        heads, n, width = src.shape
        flat = src.permute(1, 0, 2).reshape(n * heads, width).contiguous()
        dst = flat.clone()
        index, cos, sin = delta_rotation_table(torch.full((n * heads,), delta, dtype=torch.int64), slot.inv_freq)
        every = torch.arange(n * heads)
        rotate_and_splice(flat, dst, every, every, index, cos, sin, slot.offset, slot.dim, slot.pair_layout)
        turned = dst.reshape(n, heads, width).permute(1, 0, 2)
        out.append((turned, layer[1]) if slot.tensor == 0 else (layer[0], turned))
    return out


def layer1_change(model, rows: Rows, tokens: list[int], start: int, end: int) -> float:
    """Mean relative change of the layer-1 rows ``[start, end)`` when they are recomputed on the rows before."""
    if end <= start or len(rows) < 2:
        return 0.0
    _, fresh = prefill(model, tokens[start:end], start, take(rows, 0, start), keep=1)

    def flat(layer) -> torch.Tensor:
        k, v = layer
        # fp32: a bf16 cache's norms would round the change itself
        return torch.cat([k.permute(1, 0, 2).reshape(k.shape[1], -1), v.permute(1, 0, 2).reshape(v.shape[1], -1)],
                         1).float()

    new, old = flat(fresh[1]), flat(take(rows, start, end)[1])
    return float(((new - old).norm(dim=-1) / new.norm(dim=-1).clamp_min(1e-12)).mean())


# --- one policy over one session ---------------------------------------------------------------


@dataclass(kw_only=True)
class OraclePolicyRun(PolicyRun):
    rows: Rows  # the policy's cache rows of the history so far
    drift: DriftState = field(default_factory=DriftState)
    first_jsd: list[float] = field(default_factory=list)  # the next turn after each session's first edit
    first_top1: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class Edit:
    """One batch as a single span: ``old[start:old_end]`` became ``new[start:new_end]``."""

    start: int
    old_end: int
    new_end: int

    @property
    def delta(self) -> int:
        return self.new_end - self.old_end

    @property
    def old_start(self) -> int:  # the runtime's TokenEdit name, for its moved_position
        return self.start


def diff(old: list[int], new: list[int]) -> Edit:
    p, s = common_ends(old, new)
    return Edit(p, len(old) - s, len(new) - s)


def apply_edit(model, run: OraclePolicyRun, new: list[int], e: Edit, slot: RopeSlot, cfg: AutoConfig) -> None:
    """Bring ``run.rows`` (of the old history) to the edited history ``new`` under ``run.policy``."""
    prefix, n = take(run.rows, 0, e.start), len(new)
    if run.policy == "forget":
        _, rest = prefill(model, new[e.start:], e.start, prefix, keep=1)
        run.rows, run.recomputed = cat(prefix, rest), run.recomputed + n - e.start
        return
    replacement = prefill(model, new[e.start:e.new_end], e.start, prefix, keep=1)[1] if e.new_end > e.start else []
    tail = moved(take(run.rows, e.old_end, length(run.rows)), e.delta, slot)
    run.rows, run.recomputed = cat(prefix, replacement, tail), run.recomputed + e.new_end - e.start
    if run.policy == "amortize":
        return
    run.drift.budget = cfg.drift_budget
    if run.drift.earliest is not None:
        run.drift.moved(moved_position([e], run.drift.earliest))
    choice, drift = "amortize", 0.0
    if tail_is_short(cfg, n, e.new_end):
        choice = "forget"
    else:
        window = min(n, e.new_end + cfg.signal_window)
        drift = layer1_change(model, run.rows, new, e.new_end, window) * (len(run.rows) - 1)
        run.signal_tokens += window - e.new_end
        run.signals.append(drift)
        # no attention share is measured here, so no repair (the runtime sets no repair threshold by default)
        choice, _ = signal_choice(cfg, drift, attention=0.0)
    if choice == "forget":
        _recompute_from(model, run, new, e.new_end)
        run.drift.recomputed_from(e.start)
    else:
        run.drift.amortized(e.start, drift)
        if run.drift.over_budget():
            choice = "amortize+budget"
            _recompute_from(model, run, new, run.drift.repaired(n))
    run.choices[choice] += 1


def _recompute_from(model, run: OraclePolicyRun, tokens: list[int], start: int) -> None:
    _, rest = prefill(model, tokens[start:], start, take(run.rows, 0, start), keep=1)
    run.rows, run.recomputed = cat(take(run.rows, 0, start), rest), run.recomputed + len(tokens) - start


def score_turn(model, run: OraclePolicyRun, history: list[int], turn: list[int], header: int,
               reference: torch.Tensor, first: bool) -> None:
    """Prefill the next turn + an assistant header on ``run.rows``; score against ``reference``; keep the turn."""
    logits, rows = prefill(model, turn + [header], len(history), run.rows)
    jsd = jsd_rows(reference, logits)
    top1 = (reference.argmax(-1) == logits.argmax(-1)).tolist()
    run.next_jsd += jsd.tolist()
    run.next_top1 += top1
    run.probe_jsd.append(float(jsd[-1]))
    run.probe_top1.append(top1[-1])
    if first:
        run.first_jsd += jsd.tolist()
        run.first_top1 += top1
    run.rows = cat(run.rows, take(rows, 0, len(turn)))


def run_session(model, tok, session, slot: RopeSlot, cfg: AutoConfig, policies=POLICIES) -> dict:
    """Every policy over one :class:`~.edit_sessions.EditSession`; per policy the scores and costs."""
    from leyline_sdk import apply_directives

    header = tok.role_ids["assistant"]
    messages = list(session.history)
    tokens = _flat(tok, messages)
    _, rows = prefill(model, tokens, 0, [])
    runs = {p: OraclePolicyRun(p, rows=rows) for p in policies}
    forget_work, forget_err, layer0_err = 0, 0.0, 0.0
    for i, step in enumerate(session.steps):
        new_messages = apply_directives(messages, step.directives)
        new = _flat(tok, new_messages)
        e = diff(tokens, new)
        forget_work += len(new) - e.start
        turn = _flat(tok, step.next_turn)
        ref_logits, ref_rows = prefill(model, new + turn + [header], 0, [])
        for run in runs.values():
            apply_edit(model, run, new, e, slot, cfg)
            if run.policy == "amortize" and i == 0:
                layer0_err = layer0_error(run.rows, ref_rows, e.new_end, len(new), slot)
            score_turn(model, run, new, turn, header, ref_logits[len(new):], first=i == 0)
        forget_err = max(forget_err, max(runs["forget"].next_jsd[-len(turn) - 1:])) if "forget" in runs else 0.0
        messages, tokens = new_messages + list(step.next_turn), new + turn
    return {"session": session.name, "tokens": len(tokens), "forget_tokens": forget_work,
            "forget_vs_fresh_max_jsd": forget_err, "layer0_rotary_max_rel_err": layer0_err,
            "runs": {p: _record(r, forget_work, len(model.model.layers)) for p, r in runs.items()}}


def _flat(tok, messages) -> list[int]:
    return [t for m in tok.encode_messages(messages) for t in m]


def layer0_error(rows: Rows, ref: Rows, a: int, b: int, slot: RopeSlot) -> float:
    """Largest error of the moved rows' layer-0 rotary dims against a fresh prefill's, relative to their max."""
    got, want = rows[0][slot.tensor][:, a:b], ref[0][slot.tensor][:, a:b]
    sl = slice(slot.offset, slot.offset + slot.dim)
    return float((got[..., sl] - want[..., sl]).abs().max() / want[..., sl].abs().max().clamp_min(1e-30))


def _record(r: OraclePolicyRun, forget_work: int, layers: int) -> dict:
    return {"recomputed": r.recomputed, "signal_tokens": r.signal_tokens,
            "share": r.recomputed / forget_work, "share_with_signal": (r.recomputed + r.signal_tokens / layers)
            / forget_work, "choices": dict(r.choices), "signals": r.signals,
            "next_jsd": r.next_jsd, "next_top1": r.next_top1, "probe_jsd": r.probe_jsd, "probe_top1": r.probe_top1,
            "first_jsd": r.first_jsd, "first_top1": r.first_top1}

