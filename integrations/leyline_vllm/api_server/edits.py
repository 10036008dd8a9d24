"""A directive batch on vLLM: the history it makes, where its edits sit in tokens, and what was applied.

Every edit is measured by the positions its directive declared: its message span's token range in the
history before the batch, and its replacement's in the history after it (both from the chat template's
message bounds). The row plan moves the tokens between the edits by those positions (:class:`Run`).
Which mode each edit was applied in, and why, is the rule both engines share
(:mod:`leyline_runtime.outcome_rule`). The whole batch runs as one row plan (:mod:`.row_sync`), so its
row counts are reported on its first directive's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from leyline_runtime.outcome_rule import (
    AFTER_FORGET,
    AUTO_FORGET,
    DRIFT_REPAIR,
    NOT_MEASURED,
    UNSUPPORTED_RUNTIME,
    applied_modes,
    erased_auto,
    planned_mode,
)
from leyline_sdk.diff import apply_directives
from leyline_sdk.errors import InvalidDirective
from leyline_sdk.protocol import AutoDecision, Directive, DirectiveBatch, DirectiveOutcome, Message

from .row_plan import Run
from .row_sync import Sync


@dataclass(frozen=True)
class EditSpan:
    """One directive in tokens: ``[old_start, old_end)`` of the history before the batch is replaced by
    ``[new_start, new_end)`` of the history after it."""

    directive: Directive
    old_start: int
    old_end: int
    new_start: int
    new_end: int

    @property
    def mode(self) -> str:
        """The mode it is planned in (an erase: forget; :func:`~leyline_runtime.outcome_rule.planned_mode`)."""
        return planned_mode(self.directive.mode, self.directive.intent)

    @property
    def delta(self) -> int:
        return (self.new_end - self.new_start) - (self.old_end - self.old_start)


@dataclass
class EditSpans:
    """A directive batch measured against the history it edits (sorted by span)."""

    spans: list[EditSpan]
    old_len: int  # tokens of the history before the batch

    @property
    def auto(self) -> bool:
        """Some directive is ``auto`` and none ``forget``: the batch is decided by the window's signal
        (:mod:`.auto_edits`); a ``forget`` recomputes everything after it anyway."""
        modes = {s.mode for s in self.spans}
        return "auto" in modes and "forget" not in modes

    @property
    def start(self) -> int:
        """Token position where the first edit starts (for the session's drift budget)."""
        return min(s.old_start for s in self.spans)

    @property
    def runs(self) -> list[Run | None]:
        """Per edit, where the old history's tokens after it (up to the next edit) land; None where
        nothing of its own follows it, and from the first ``forget`` on (it recomputes what follows)."""
        out: list[Run | None] = []
        forgotten = False
        for k, s in enumerate(self.spans):
            forgotten = forgotten or s.mode == "forget"
            end = self.spans[k + 1].old_start if k + 1 < len(self.spans) else self.old_len
            out.append(None if forgotten or end <= s.old_end else Run(s.old_end, s.new_end, end - s.old_end))
        return out


def replacement_bounds(batch: DirectiveBatch) -> list[int]:
    """Message counts in the history after ``batch`` whose token bounds :func:`edit_spans` takes: where
    each replacement (in span order) starts and where it ends."""
    out, shift = [], 0
    for d in sorted(batch.directives, key=lambda d: (d.span.start, d.span.end)):
        first = d.span.start + shift
        shift += len(d.replacement) - (d.span.end - d.span.start)
        out += [first, first + len(d.replacement)]
    return out


def edit_spans(batch: DirectiveBatch, old_bounds: list[tuple[int, int]], new_bounds: list[int]) -> EditSpans:
    """``batch`` in tokens: ``old_bounds``, the token range of every message before the batch;
    ``new_bounds``, the token bounds after it at :func:`replacement_bounds`'s message counts."""
    old_len = old_bounds[-1][1] if old_bounds else 0
    spans = []
    for k, d in enumerate(sorted(batch.directives, key=lambda d: (d.span.start, d.span.end))):
        start = old_bounds[d.span.start][0] if d.span.start < len(old_bounds) else old_len
        end = old_bounds[d.span.end - 1][1] if d.span.end > d.span.start else start
        spans.append(EditSpan(d, start, end, new_bounds[2 * k], new_bounds[2 * k + 1]))
    return EditSpans(spans, old_len)


def directive_outcomes(edits: EditSpans, sync: Sync, recomputed: int) -> list[DirectiveOutcome]:
    """Per directive what was applied; the batch ran as one plan, so its row counts sit on the first."""
    plan, runs = sync.plan, edits.runs
    moved = plan.run if plan.rotated is not None else None
    computed = {k: plan.unmoved.get(k) or _decided(sync) for k, r in enumerate(runs) if r is not None and k != moved}
    applied = applied_modes([s.directive.mode for s in edits.spans], intents=[s.directive.intent for s in edits.spans],
                            moves_rows=[s.old_end < edits.old_len for s in edits.spans],
                            unsupported=sync.refusal, recomputed=computed, recomputed_all=sync.fallback)
    outcomes = []
    for i, (s, a) in enumerate(zip(edits.spans, applied)):
        reason, auto = a.fallback_reason, erased_auto(s.directive.mode, a.fallback_reason)
        if s.mode == "auto":
            auto, reason = _auto_decision(edits, sync, a.mode, reason)
        totals = i == 0
        outcomes.append(DirectiveOutcome(
            requested_mode=s.directive.mode, intent=s.directive.intent, applied_mode=a.mode, fallback_reason=reason,
            token_start=s.old_start, token_end=s.old_end, delta=s.delta,
            reused_tokens=sync.reused if totals else 0, rotated_tokens=sync.rotated if totals else 0,
            recomputed_tokens=recomputed if totals else 0, auto=auto))
    return outcomes


def _decided(sync: Sync) -> str:
    """Why the batch's run was computed after all, where the plan asked to move it: mode auto decided."""
    return AUTO_FORGET if sync.auto is None or sync.auto.choice == "forget" else DRIFT_REPAIR


def _auto_decision(edits: EditSpans, sync: Sync, applied: str, reason: str | None) -> tuple[AutoDecision, str | None]:
    """An ``auto`` directive's decision, and its fallback reason (none where the decision says it all)."""
    if reason == AFTER_FORGET:  # as the runtime reports it: auto's choice was made for it
        return AutoDecision(choice="forget", reason=AFTER_FORGET), None
    if reason is not None and reason.startswith(UNSUPPORTED_RUNTIME):
        return AutoDecision(choice="forget", reason=UNSUPPORTED_RUNTIME), reason
    if sync.auto is None or not edits.auto:  # nothing was measured (a batch with a forget, or a failed load)
        return AutoDecision(choice=applied, reason=NOT_MEASURED), reason
    return sync.auto.model_copy(), None if reason == AUTO_FORGET else reason


def edited(messages: list[Message], batch: DirectiveBatch) -> list[Message]:
    """The history after ``batch``; a bad batch raises a 4xx error and changes nothing."""
    for i, d in enumerate(batch.directives):
        if d.span.unit != "message":
            raise InvalidDirective(f"directive {i}: token spans are not supported on vLLM; use message spans")
    return apply_directives(messages, batch.directives)  # validates spans, overlaps
