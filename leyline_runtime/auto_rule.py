"""Mode ``auto``'s rule and the session's drift budget, once for both engines (torch-free).

The bundled runtime (:mod:`leyline_runtime.directives.auto_mode`) and the vLLM plugin
(``leyline_vllm.api_server``) measure an edit's signal each in its own cache, then decide here:

* at most ``short_tail`` (or ``repair_tail``) tokens after the edit: ``forget`` (it costs no more
  than a repair);
* the edit's *drift* (its layer-1 change times ``num_layers - 1``: a stale layer-1 row feeds every
  layer above) over ``forget_threshold``: ``forget``;
* drift times the attention the next turn pays the edit over ``repair_threshold`` (if one is set):
  ``repair``;
* else ``amortize``.

Every amortized ``auto`` edit adds its drift to the session's (:class:`DriftState`); past the budget
the engine re-prefills from the earliest drifted position, after which the session's cache equals an
honest prefill of its history again. Plain bookkeeping: positions and sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from leyline_sdk.protocol import DriftInfo


@dataclass
class AutoConfig:
    """Mode "auto"'s thresholds and the per-session drift budget."""

    # Calibrated with `leyline-bench fidelity --policies ...` (docs/perf/fidelity_policies.md)
    # on the default model and its 12/18-layer stacks, sessions 0-1 (the docs report others).
    forget_threshold: float = 8.0  # on the edit's drift: layer-1 change x (num_layers - 1)
    # On the edit's drift x the attention the next turn pays it; None: never. Off by default: in
    # the calibration a 32-row tail repair after every edit cost 0.034 of forget's recompute and
    # bought next-turn top-1 +0.0003..+0.0014, while the same rows spent on an earlier drift-budget
    # repair bought +0.002..+0.003 (a repair makes every row exact; a tail repair recomputes the
    # tail against the stale rows before it).
    repair_threshold: float | None = None
    short_tail: int = 128  # at most this many tokens after the edit: forget (a repair would cost as much)
    repair_tail: int = 32
    signal_window: int = 64
    attention_queries: int = 8  # newest positions whose layer-0 attention stands in for the next turn's
    # In drift units (layer-1 change x (num_layers - 1)): deeper models pass it sooner. 14 from the
    # calibration sessions of run 8's weights, the default model before run 9 (budgets 9/10/12/14 on
    # the 18-layer stack cost 21.2/20.5/15.0/11.9% of forget's recompute at next-turn top-1
    # 0.991/0.991/0.990/0.991; with 14 the 6- and 12-layer models keep 0.997 and 0.994).
    drift_budget: float | None = 14.0


def tail_is_short(config: AutoConfig, n: int, edit_end: int) -> bool:
    """At most ``short_tail`` (or ``repair_tail``) tokens after the edit: a forget costs no more than a repair."""
    return n - edit_end <= max(config.short_tail, config.repair_tail)


def edit_drift(layer1_change: float, num_layers: int) -> float:
    """An edit's drift: its layer-1 change, weighted by the layers a stale layer-1 row propagates through."""
    return layer1_change * max(0, num_layers - 1)


def signal_choice(config: AutoConfig, drift: float, attention: float) -> tuple[str, str]:
    """(choice, reason) for an edit whose tail is long enough to measure, from its drift and attention share."""
    if drift > config.forget_threshold:
        return "forget", "signal"
    if config.repair_threshold is not None and drift * attention > config.repair_threshold:
        return "repair", "signal"
    return "amortize", "below_threshold"


class PositionedEdit(Protocol):
    """An edit as positions in the old token sequence and the shift it causes."""

    old_start: int
    old_end: int
    delta: int


def moved_position(edits: Sequence[PositionedEdit], old: int) -> int:
    """Where old position ``old`` lands after the edits (an edit's start if the edit covers it)."""
    shift = 0
    for t in edits:
        if old < t.old_start:
            break
        if old < t.old_end or old == t.old_start:
            return t.old_start + shift
        shift += t.delta
    return old + shift


@dataclass
class DriftState:
    budget: float | None = None  # None: never repair for drift
    drift: float = 0.0
    earliest: int | None = None  # first token position whose rows may be stale
    repairs: int = 0
    repaired_tokens: int = 0

    def copy(self) -> "DriftState":
        return replace(self)

    def info(self) -> DriftInfo:
        return DriftInfo(drift=self.drift, budget=self.budget, earliest_position=self.earliest,
                         repairs=self.repairs, repaired_tokens=self.repaired_tokens)

    def moved(self, new_position: int | None) -> None:
        """The edits of a batch moved the earliest stale token to ``new_position``."""
        self.earliest = new_position

    def amortized(self, position: int, signal: float) -> None:
        """An edit at ``position`` was spliced in place; ``signal``: its measured drift (0 if unmeasured)."""
        self.earliest = position if self.earliest is None else min(self.earliest, position)
        self.drift += signal

    def recomputed_from(self, position: int) -> None:
        """Every row from ``position`` on was recomputed exactly (forget or repair)."""
        if self.earliest is not None and position <= self.earliest:
            self.drift, self.earliest = 0.0, None

    def over_budget(self) -> bool:
        return self.budget is not None and self.earliest is not None and self.drift > self.budget

    def repaired(self, num_tokens: int) -> int:
        """A budget repair re-prefilled from ``earliest`` to the end (``num_tokens``); returns its start."""
        start = self.earliest
        self.repairs += 1
        self.repaired_tokens += num_tokens - start
        self.drift, self.earliest = 0.0, None
        return start
