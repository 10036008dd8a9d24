"""``mode: "auto"``: measure an amortized edit's drift and choose amortize, repair or forget.

Amortize is exact at layer 0 and approximate above it: the rows of layer 1 and up
after the edit were computed while the old span was still there. Two signals, both
read from the spliced cache:

* ``layer1_change`` — the mean relative change of the layer-1 rows of the first
  ``signal_window`` tokens after the edit when layer 0 is run again over the edited
  history (layer 0's rows are exact after the splice, so this is exactly what a forget
  would write there, at about ``signal_window / num_layers`` tokens' worth of compute).
  Times ``num_layers - 1`` it is the edit's *drift*: the stale layer-1 rows feed every
  layer above, and the same edit drifts about 3× / 9× more on 12 / 18-layer stacks of
  the same weights while its layer-1 change is identical.
* ``attention`` — the share of layer-0 attention that the session's newest positions
  (standing in for the next turn) put on the edit and the measured rows after it.

Per directive, in position order:

* at most ``short_tail`` tokens after the edit: ``forget`` (it costs no more than a repair);
* drift over ``forget_threshold``: ``forget``;
* drift × attention over ``repair_threshold`` (if one is set; none by default): ``repair`` —
  amortize, then recompute the last ``repair_tail`` rows (the ones the next turn attends to
  most; see :mod:`.recompute`);
* else ``amortize``.

Every amortized ``auto`` edit adds its drift to the session's (``DriftState``, walked by
:mod:`.batch_drift`); past the drift budget the batch also re-prefills from the earliest drifted
position. The budget is in drift units, so deeper models (more drift per edit) are repaired more
often. All of it runs inside the executor's transaction (:meth:`~.executor.DirectiveExecutor.execute`
calls :meth:`AutoDecider.decide` for a batch with an ``auto`` edit, and only then), before the
block table is swapped.
"""

from __future__ import annotations

import torch

from leyline_sdk.protocol import AutoDecision

from leyline_runtime.auto_rule import AutoConfig, DriftState, edit_drift, signal_choice, tail_is_short
from leyline_runtime.engine.engine import Engine
from leyline_runtime.directives.batch_drift import walk_batch
from leyline_runtime.directives.executor import PREFILL, Plan, TokenEdit, Transaction
from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.model.batch import BatchLayout
from leyline_runtime.sessions.session import Session


@torch.no_grad()
def layer1_change(engine: Engine, table: BlockTable, tokens: list[int], start: int, end: int) -> float:
    """Mean relative change of the layer-1 rows ``[start, end)`` if layer 0 were recomputed.

    Reads the cache only: layer 0 writes its (equal) rows into a scratch copy.
    """
    layers = engine.model.model.layers
    if len(layers) < 2 or end <= start:
        return 0.0
    pool, device = engine.pool.rows, engine.device
    rows = table.rows(0, end, device)
    scratch = pool[0, rows].clone()
    ids = torch.tensor(tokens[start:end], dtype=torch.long, device=device)
    positions = torch.arange(start, end, device=device)
    model = engine.model
    x = model.model.embed_tokens(ids)
    cos, sin = model.rotary.cos_sin(positions, x.dtype)
    layout = BatchLayout.build([(start, end - start, [(0, end)])], [], device)  # scratch row p = position p
    h = layers[0].forward_batch(x, cos, sin, scratch, layout)
    fresh = layers[1].self_attn.latent(layers[1].input_layernorm(h), cos, sin).float()
    stale = pool[1, rows[start:end]].float()
    change = (fresh - stale).norm(dim=-1) / fresh.norm(dim=-1).clamp_min(1e-12)
    return float(change.mean())


@torch.no_grad()
def layer0_attention(engine: Engine, table: BlockTable, tokens: list[int], start: int, end: int,
                     queries: int) -> float:
    """Share of layer-0 attention that the last ``queries`` positions put on rows ``[start, end)``.

    The newest positions stand in for the next turn's queries (it follows them and attends
    much like them). Layer 0's rows are exact after the splice and a layer-0 query needs only
    its token and position, so this reads the cache and costs ``queries`` query projections.
    """
    n = len(tokens)
    queries = min(queries, n)
    if queries == 0 or end <= start:
        return 0.0
    model, device = engine.model, engine.device
    attn = model.model.layers[0].self_attn
    positions = torch.arange(n - queries, n, device=device)
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(
        torch.tensor(tokens[n - queries:], dtype=torch.long, device=device)))
    cos, sin = model.rotary.cos_sin(positions, x.dtype)
    q_nope, q_pe = attn._queries(x, cos, sin)  # [Q, H, .]
    w_uk, _ = attn._weights()
    q = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe), dim=-1).float()
    rows = engine.pool.rows[0, table.rows(0, n, device)].float()  # [n, r + rope]
    scores = torch.einsum("thd,nd->thn", q, rows) * attn.scale
    causal = torch.arange(n, device=device)[None, :] > positions[:, None]  # [Q, n]
    probs = scores.masked_fill(causal[:, None, :], float("-inf")).softmax(dim=-1)
    return float(probs[..., start:end].sum(-1).mean())


class AutoDecider:
    """Decides a batch's ``auto`` edits inside the executor's transaction (its ``decide``): the
    executor hands a batch here only when it has one."""

    def __init__(self, config: AutoConfig):
        self.config = config

    def decide(self, session: Session, plan: Plan, txn: Transaction) -> None:
        """Decide every ``auto`` edit of ``plan`` (spliced and prefilled into ``txn.table``), run the
        recomputes they need, and leave the session's next drift state in ``plan.drift``."""
        n = len(plan.tokens)
        num_layers = txn.engine.model.config.num_hidden_layers

        def decide_edit(t: TokenEdit, s: int) -> tuple[AutoDecision, float]:
            decision = self._decide(txn.engine, txn.table, plan.tokens, s, s + len(t.new_tokens))
            return decision, edit_drift(decision.layer1_change or 0.0, num_layers)

        walk = walk_batch(session.drift, plan.edits, self.config.drift_budget, decide_edit)
        start = self._recompute_start(walk.decisions, walk.state, walk.forget_from, n)
        if start is not None and start != walk.prefilled_from:
            # An auto forget's replacement rows were already prefilled against the rows before
            # it: recomputing them would write the same rows again.
            txn.recompute(walk.fresh_until if start == walk.forget_from else start, n)
            plan.old_pos[start:] = PREFILL
        for d in walk.decisions:
            d.session_drift = walk.state.drift
        plan.drift = walk.state

    def _recompute_start(self, decisions: list[AutoDecision], state: DriftState, forget_from: int | None,
                         n: int) -> int | None:
        """Where the rows to recompute begin: the forget, a drift-budget repair or the repair tail."""
        start = forget_from
        if decisions and state.over_budget():
            budget_start = state.repaired(n)
            decisions[-1].drift_repair_tokens = n - budget_start
            start = budget_start if start is None else min(start, budget_start)
        repairs = [d for d in decisions if d.choice == "repair"]
        tail = self.config.repair_tail
        if repairs and (start is None or start > n - tail):
            start = n - tail
            repairs[-1].repaired_tokens = tail
        return start

    def _decide(self, engine: Engine, table: BlockTable, tokens: list[int], start: int,
                edit_end: int) -> AutoDecision:
        cfg, n = self.config, len(tokens)
        if tail_is_short(cfg, n, edit_end):
            return AutoDecision(choice="forget", reason="short_tail")
        window_end = min(n, edit_end + cfg.signal_window)
        change = layer1_change(engine, table, tokens, edit_end, window_end)
        attention = layer0_attention(engine, table, tokens, start, window_end, cfg.attention_queries)
        choice, reason = signal_choice(cfg, edit_drift(change, engine.model.config.num_hidden_layers), attention)
        return AutoDecision(choice=choice, reason=reason, layer1_change=change, attention=attention,
                            signal_tokens=window_end - edit_end)


__all__ = ["AutoDecider", "layer1_change"]
