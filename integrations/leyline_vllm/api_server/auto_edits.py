"""Mode ``auto`` on vLLM: the edit's drift measured in vLLM's paged cache, the runtime's rule applied.

An ``auto`` batch is planned as an amortize whose moved run starts with a *window* of
``signal_window`` tokens computed exactly, right after the replacement (:func:`.row_plan.plan_turn`).
Once that first request has run, the worker compares, layer by layer, the window's exact rows with
the rows an amortize would have moved there (the old snapshot's, rotated:
``LeylineWorkerExtension.leyline_drift``). The layer-1 difference is the edit's signal, the one the
bundled runtime reads (there by recomputing layer 0 over the window); the decision is the bundled
runtime's own rule (:mod:`leyline_runtime.auto_rule`, one implementation for both engines):

* a short tail after the edit (or nothing long enough to move): ``forget``;
* drift (layer-1 change x (layers - 1)) over ``forget_threshold``: ``forget`` — the window's exact rows
  are kept and everything after them computed;
* else ``amortize``: the rest of the run is loaded rotated, the window's rows stay exact (reported as
  ``repaired_tokens``), and the drift is added to the session's budget; past the budget the turn
  re-prefills from the earliest drifted position instead.

vLLM gives no cheap read of the next turn's attention, so ``attention`` is not measured; with a
``repair_threshold`` set, the rule is applied with the whole attention (1.0), the conservative side.
The thresholds come from ``LEYLINE_VLLM_AUTO`` (a JSON object of :class:`AutoConfig` fields) in the
environment of ``vllm serve``; unset, the runtime's defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

from leyline_runtime.auto_rule import AutoConfig, DriftState, edit_drift, signal_choice, tail_is_short
from leyline_sdk.protocol import AutoDecision

from .row_plan import TurnPlan

AUTO_CONFIG_ENV = "LEYLINE_VLLM_AUTO"


def auto_config_from_env() -> AutoConfig:
    raw = os.environ.get(AUTO_CONFIG_ENV)
    if not raw:
        return AutoConfig()
    values = json.loads(raw)
    known = {f.name for f in fields(AutoConfig)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{AUTO_CONFIG_ENV}: unknown fields {sorted(unknown)} (known: {sorted(known)})")
    return AutoConfig(**values)


@dataclass
class AutoVerdict:
    """What the first request's window decided for the batch."""

    decision: AutoDecision
    rotate: bool  # load the rest of the moved run rotated (amortize); else compute it
    repair_from: int | None = None  # a drift-budget repair: keep only the rows before this position


class AutoRule:
    def __init__(self, config: AutoConfig, num_layers: int):
        self.config = config
        self.num_layers = num_layers

    def before_measuring(self, plan: TurnPlan, prompt_len: int) -> AutoDecision | None:
        """The decision when there is nothing to measure (applied as forget), else None."""
        window = plan.window
        if window is None:
            return AutoDecision(choice="forget", reason="short_tail")
        if tail_is_short(self.config, prompt_len, window.dst_start):
            return AutoDecision(choice="forget", reason="short_tail")
        return None

    def after_measuring(self, plan: TurnPlan, drift_state: DriftState, per_layer: list[float] | None,
                        edit_start: int, prompt_len: int) -> AutoVerdict:
        """Decide from the window's per-layer change (None: a snapshot was gone, measured nothing: forget)."""
        window = plan.window
        if per_layer is None:
            decision = AutoDecision(choice="forget", reason="signal_unavailable", signal_tokens=0)
            drift_state.recomputed_from(edit_start)
            return AutoVerdict(decision, rotate=False)
        change = per_layer[1] if len(per_layer) > 1 else 0.0
        drift = edit_drift(change, self.num_layers)
        choice, reason = signal_choice(self.config, drift, attention=1.0)
        decision = AutoDecision(choice=choice, reason=reason, layer1_change=change, attention=None,
                                signal_tokens=window.count)
        if choice == "forget" or plan.rotated is None:
            if plan.rotated is None and choice != "forget":
                decision.choice, decision.reason = "forget", "short_tail"
            drift_state.recomputed_from(edit_start)
            decision.session_drift = drift_state.drift
            return AutoVerdict(decision, rotate=False)
        decision.repaired_tokens = window.count  # the window's rows were computed exactly and stay
        drift_state.amortized(edit_start, drift)
        if drift_state.over_budget():
            start = drift_state.repaired(prompt_len)
            decision.drift_repair_tokens = prompt_len - start
            decision.session_drift = drift_state.drift
            return AutoVerdict(decision, rotate=False, repair_from=start)
        decision.session_drift = drift_state.drift
        return AutoVerdict(decision, rotate=True)
