"""``leyline-bench fidelity --policies amortize,forget,forget-every-5,auto``: cost vs drift per policy.

Every policy gets its own session of the same history and the same edits:

* ``amortize`` / ``forget`` / ``auto`` — every directive in that mode (``auto``: the runtime's
  choice, with its drift budget);
* ``forget-every-N`` — amortize, but every N-th edit is a forget from the earliest position an
  earlier amortized edit touched (the rows before the edit are recomputed first, then the forget
  recomputes the rest once: the session is exact again).

The reference R is the ``forget`` session: keep the untouched prefix, prefill the rest — an
honest prefill of the edited history (its prefix rows are the earlier honest prefill's rows of
the same tokens). At the end of every session a fresh prefill of the final history checks that
claim (``forget_vs_fresh``).

Measured per policy: rows recomputed (directive replacements, forgets, repairs) as a share of
forget's, plus the ``auto`` signal's cost (one layer per measured position, as token
equivalents ``signal_tokens / num_layers``); the *next turn* — after each edit the next tool
round and an assistant header are prefilled onto every session and each position's
next-token distribution is compared with R's (JSD in nats, top-1 agreement); the *whole
suffix* — after the last edit every token from the first edited position on is re-queried
through all layers against each session's cached rows (positions ≤ its own) and compared
with R's.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from leyline_sdk.protocol import Directive, DirectiveBatch, SessionCreate

from leyline_runtime.auto_rule import AutoConfig
from leyline_runtime.inspection import Inspector
from leyline_runtime.runtime import Runtime
from .edit_sessions import EditSession

TENANT = "__policies__"
EVERY = re.compile(r"forget-every-(\d+)$")
#: a next-turn position is *decisive* when R's top-1 probability leads its second by at least this
#: much; on the 18-layer stack 77% of auto's top-1 disagreements were at the 7% of positions below it
DECISIVE = 0.02


def check_policies(names: list[str]) -> list[str]:
    for name in names:
        if name not in ("amortize", "forget", "auto") and not EVERY.match(name):
            raise ValueError(f"unknown policy {name!r} (amortize, forget, auto or forget-every-N)")
    if "forget" not in names:
        names = [*names, "forget"]  # the reference and the cost unit
    return names


@dataclass
class PolicyRun:
    """One history policy's record over one session: the tokens it recomputed, what ``auto`` chose and on which
    signals, how far each next turn moved from the reference's. Each engine's run extends it: the runtime's
    (:class:`RuntimePolicyRun`) and the transformers oracle's (``drift.drift_oracle.OraclePolicyRun``)."""

    policy: str
    recomputed: int = 0
    signal_tokens: int = 0
    choices: Counter = field(default_factory=Counter)
    signals: list[float] = field(default_factory=list)
    next_jsd: list[float] = field(default_factory=list)
    next_top1: list[bool] = field(default_factory=list)
    probe_jsd: list[float] = field(default_factory=list)  # the assistant-header position of each turn
    probe_top1: list[bool] = field(default_factory=list)


@dataclass(kw_only=True)
class RuntimePolicyRun(PolicyRun):
    session_id: str
    attention: list[float] = field(default_factory=list)
    suffix_jsd: list[float] = field(default_factory=list)
    suffix_top1: list[bool] = field(default_factory=list)
    first_change: int = 0  # where the last batch's first edit began

    def mode(self, step: int) -> str:
        every = EVERY.match(self.policy)
        if every:
            return "forget" if (step + 1) % int(every.group(1)) == 0 else "amortize"
        return self.policy


# --- scoring ----------------------------------------------------------------------------------


def jsd_rows(p_logits: torch.Tensor, q_logits: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per-row Jensen-Shannon divergence (nats) between two [T, vocab] logit tensors."""
    out = []
    for s in range(0, p_logits.shape[0], chunk):
        lp = torch.log_softmax(p_logits[s:s + chunk].double(), -1)
        lq = torch.log_softmax(q_logits[s:s + chunk].double(), -1)
        m = torch.logaddexp(lp, lq) - math.log(2.0)
        out.append(0.5 * (lp.exp() * (lp - m)).sum(-1) + 0.5 * (lq.exp() * (lq - m)).sum(-1))
    return torch.cat(out).clamp_min(0.0)


# --- running one session under every policy ---------------------------------------------------


def _recomputed(rt: Runtime, session_id: str) -> int:
    return rt.get_session(session_id, TENANT).counters.recomputed_tokens


def _apply(rt: Runtime, arm: RuntimePolicyRun, step: int, directives: list[Directive]) -> None:
    before = _recomputed(rt, arm.session_id)
    mode = arm.mode(step)
    batch = [d.model_copy(update={"mode": mode}) for d in directives]
    if EVERY.match(arm.policy) and mode == "forget":
        _repair_before(rt, arm.session_id, batch)
    result = rt.apply(DirectiveBatch(session_id=arm.session_id, directives=batch), TENANT)
    arm.recomputed += _recomputed(rt, arm.session_id) - before  # the repair's rows and the batch's
    arm.first_change = min(o.token_start for o in result.outcomes)
    for o in result.outcomes:
        if o.auto is not None:
            arm.signal_tokens += o.auto.signal_tokens
            arm.choices[o.auto.choice + ("+budget" if o.auto.drift_repair_tokens else "")] += 1
            if o.auto.layer1_change is not None:
                arm.signals.append(o.auto.layer1_change)
                arm.attention.append(o.auto.attention)


def _repair_before(rt: Runtime, session_id: str, batch: list[Directive]) -> None:
    """Before a forget-every-N forget: recompute the rows from the earliest position an earlier
    amortized edit touched up to where the forget begins (the forget recomputes the rest), so the
    session equals a fresh prefill at the cost of one re-prefill from the earliest drift, and its
    drift record says so."""
    inspect = Inspector(rt)
    start = rt.get_session(session_id, TENANT).drift.earliest_position
    if start is not None:
        inspect.recompute(session_id, start, inspect.first_change(session_id, batch, TENANT), TENANT)


def run_session(rt: Runtime, session: EditSession, policies: list[str], whole_suffix: bool = True) -> dict:
    def fresh(policy: str) -> RuntimePolicyRun:
        created = rt.create_session(SessionCreate(messages=session.history), TENANT)
        return RuntimePolicyRun(policy, session_id=created.session_id)

    arms = {p: fresh(p) for p in policies}
    ref = arms["forget"]
    inspect = Inspector(rt)
    first_edit = None
    decisive: list[bool] = []  # per next-turn position: R's top-1 leads its second by >= DECISIVE
    try:
        for k, step in enumerate(session.steps):
            for arm in arms.values():
                _apply(rt, arm, k, step.directives)
            # positions before the earliest edit so far never changed, in any session
            first_edit = ref.first_change if first_edit is None else min(first_edit, ref.first_change)
            logits = {p: inspect.append_scored(a.session_id, step.next_turn, TENANT) for p, a in arms.items()}
            top2 = torch.softmax(logits["forget"].double(), -1).topk(2, dim=-1).values
            decisive += (top2[:, 0] - top2[:, 1] >= DECISIVE).tolist()
            for p, arm in arms.items():
                j = jsd_rows(logits["forget"], logits[p])
                arm.next_jsd += j.tolist()
                top1 = (logits["forget"].argmax(-1) == logits[p].argmax(-1)).tolist()
                arm.probe_jsd.append(float(j[-1]))
                arm.probe_top1.append(top1[-1])
                arm.next_top1 += top1
        check = _check_reference(rt, ref, first_edit, whole_suffix)
        if whole_suffix:
            ref_logits = check.pop("logits")
            for p, arm in arms.items():
                logits = ref_logits if p == "forget" else inspect.suffix_logits(arm.session_id, first_edit, TENANT)
                arm.suffix_jsd = jsd_rows(ref_logits, logits).tolist()
                arm.suffix_top1 = (ref_logits.argmax(-1) == logits.argmax(-1)).tolist()
        tokens = rt.get_session(ref.session_id, TENANT).num_tokens
    finally:
        for arm in arms.values():
            if rt.has_session(arm.session_id, TENANT):
                rt.delete_session(arm.session_id, TENANT)
    return {"name": session.name, "edits": len(session.steps), "kinds": dict(Counter(s.kind for s in session.steps)),
            "final_tokens": tokens, "first_edit": first_edit, "forget_vs_fresh": check, "next_decisive": decisive,
            "arms": {p: _arm_record(a) for p, a in arms.items()}}


def _check_reference(rt: Runtime, ref: RuntimePolicyRun, first_edit: int, whole_suffix: bool) -> dict:
    """A fresh prefill of the final history against the forget session (R)."""
    messages, _ = rt.session_messages(ref.session_id, TENANT)
    fresh = rt.create_session(SessionCreate(messages=messages), TENANT).session_id
    inspect = Inspector(rt)
    try:
        a = inspect.suffix_logits(ref.session_id, first_edit, TENANT)
        b = inspect.suffix_logits(fresh, first_edit, TENANT)
    finally:
        rt.delete_session(fresh, TENANT)
    j = jsd_rows(b, a)
    out = {"max_jsd": float(j.max()), "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean())}
    if whole_suffix:
        out["logits"] = b
    return out


def _arm_record(a: RuntimePolicyRun) -> dict:
    return {"policy": a.policy, "recomputed": a.recomputed, "signal_tokens": a.signal_tokens,
            "choices": dict(a.choices), "signals": a.signals, "attention": a.attention, "next_jsd": a.next_jsd,
            "next_top1": a.next_top1,
            "probe_jsd": a.probe_jsd, "probe_top1": a.probe_top1, "suffix_jsd": a.suffix_jsd, "suffix_top1": a.suffix_top1}


def auto_config(args) -> AutoConfig:
    base = AutoConfig()
    budget = args.drift_budget if args.drift_budget is not None else base.drift_budget
    repair = _pick(args.auto_repair_threshold, base.repair_threshold)
    return replace(base, forget_threshold=_pick(args.auto_forget_threshold, base.forget_threshold),
                   repair_threshold=None if repair is not None and repair < 0 else repair,
                   repair_tail=_pick(args.auto_repair_tail, base.repair_tail),
                   drift_budget=None if budget is not None and budget < 0 else budget)


def _pick(value, default):
    return default if value is None else value
