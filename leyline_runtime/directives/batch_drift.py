"""How a directive batch moves the session's drift record (where its possibly stale rows begin).

Every batch walks its edits here (an exact recompute of rows moves the record too), inside the executor's transaction, whatever their modes. The
edits move the earliest stale position; everything from the batch's first forget on is recomputed,
so the edits there are forgotten too and a record that began there is cleared; an explicit
``amortize`` is an unmeasured splice (drift 0: it only moves a later repair's start). An ``auto``
edit is measured and decided by the caller's ``decide_edit`` (:mod:`.auto_mode`), so a batch
without one never reaches auto mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leyline_sdk.protocol import AutoDecision

from leyline_runtime.auto_rule import DriftState, moved_position
from leyline_runtime.outcome_rule import AFTER_FORGET

if TYPE_CHECKING:  # the executor imports this module: its edits are only annotations here
    from leyline_runtime.directives.executor import TokenEdit

# (an auto edit, its start in the edited sequence) -> (its decision, its drift if it is amortized)
DecideEdit = Callable[["TokenEdit", int], tuple[AutoDecision, float]]


@dataclass
class BatchDrift:
    state: DriftState  # the session's drift record after the batch
    prefilled_from: int | None  # where the executor already prefilled everything (an explicit forget or a fallback)
    forget_from: int | None  # where the batch's forget begins (that, or an auto edit decided forget)
    fresh_until: int | None  # where the forget's already prefilled replacement rows end
    decisions: list[AutoDecision]  # the auto edits', in position order


def new_starts(edits: Sequence[TokenEdit]) -> list[int]:
    """Each edit's start in the edited sequence."""
    out, shift = [], 0
    for t in edits:
        out.append(t.old_start + shift)
        shift += t.delta
    return out


def walk_batch(drift: DriftState, edits: Sequence[TokenEdit], budget: float | None,
               decide_edit: DecideEdit | None = None) -> BatchDrift:
    """The edits in position order, from the session's record ``drift`` (not changed); ``decide_edit``
    decides each ``auto`` edit before the batch's first forget (a batch with one needs it)."""
    state = drift.copy()
    state.budget = budget
    if state.earliest is not None:
        state.moved(moved_position(edits, state.earliest))
    starts = new_starts(edits)
    prefilled_from = next((s for t, s in zip(edits, starts) if t.applied_mode == "forget"), None)
    forget_from, fresh_until, decisions = prefilled_from, prefilled_from, []
    for t, s in zip(edits, starts):
        if forget_from is not None and s >= forget_from:
            if t.edit.mode == "auto":
                t.auto = AutoDecision(choice="forget", reason=t.fallback_reason or AFTER_FORGET)
                t.fallback_reason = None
            elif t.applied_mode == "amortize":
                t.fallback_reason = AFTER_FORGET
            t.applied_mode = "forget"
        elif t.edit.mode != "auto":
            state.amortized(s, 0.0)  # unmeasured: it only moves a repair's start
        elif decide_edit is None:
            raise ValueError("a batch with auto edits needs a decider")
        else:
            t.auto, edit_drift = decide_edit(t, s)
            if t.auto.choice == "forget":
                t.applied_mode, forget_from, fresh_until = "forget", s, s + len(t.new_tokens)
            else:
                state.amortized(s, edit_drift)
        if t.auto is not None:
            decisions.append(t.auto)
    if forget_from is not None:
        state.recomputed_from(forget_from)
    return BatchDrift(state, prefilled_from, forget_from, fresh_until, decisions)


def recomputed_rows(drift: DriftState, start: int, end: int, num_tokens: int) -> None:
    """Rows ``[start, end)`` of a session of ``num_tokens`` were recomputed exactly (no edit). Rows before
    the earliest drifted position are exact, so when ``[start, end)`` holds it the recomputed rows
    are exact too and the earliest drifted position moves to ``end``."""
    if drift.earliest is not None and start <= drift.earliest < end:
        if end < num_tokens:
            drift.moved(end)
        else:  # every row from start on: the session is exact again
            drift.recomputed_from(start)
