"""A directive batch on vLLM: the history it makes, where its edits sit in tokens, and what was applied.

The whole batch runs as one row plan (:mod:`.row_sync`), so its row counts are reported on its first
directive's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from leyline_sdk.diff import apply_directives
from leyline_sdk.errors import InvalidDirective
from leyline_sdk.protocol import AutoDecision, Directive, DirectiveBatch, DirectiveOutcome, Message

from .row_sync import Sync


@dataclass
class EditSpans:
    """A directive batch measured against the history it edits: per directive (sorted by span) its
    old token range and its replacement's length."""

    spans: list[tuple[Directive, int, int, int]]  # directive, old start, old end, replacement tokens
    old_len: int
    rotate: bool  # every directive amortizes: the rows after the edits move

    @property
    def auto(self) -> bool:
        """Some directive is ``auto`` and none ``forget``: the batch is decided by the window's signal
        (:mod:`.auto_edits`); a ``forget`` recomputes everything after it anyway."""
        modes = {d.mode for d, *_ in self.spans}
        return "auto" in modes and "forget" not in modes

    @property
    def start(self) -> int:
        """Token position where the first edit starts (for the session's drift budget)."""
        return min(start for _, start, _, _ in self.spans)

    @property
    def after(self) -> int | None:
        """Index, in the edited history, of the first message after a single edit (None: several)."""
        if len(self.spans) != 1:
            return None
        d = self.spans[0][0]
        return d.span.start + len(d.replacement)

    def moved(self, bounds: list[int]) -> tuple[int, int] | None:
        """(old, new) token position of the first token after a single edit — a hint for the row plan;
        ``bounds``: the edited history's token bounds asked for at :attr:`after` (last)."""
        return (self.spans[0][2], bounds[-1]) if self.after is not None and bounds else None


def directive_outcomes(edits: EditSpans, sync: Sync, recomputed: int) -> list[DirectiveOutcome]:
    """Per directive what was applied; the batch ran as one plan, so its row counts sit on the first."""
    outcomes = []
    for i, (d, start, end, new_len) in enumerate(edits.spans):
        applied, reason, auto = d.mode, None, None
        if d.mode == "auto":
            # one decision for the batch (one row plan); a forget in the batch recomputes after it anyway
            auto = sync.auto.model_copy() if sync.auto is not None else \
                AutoDecision(choice="forget", reason="after_forget" if not edits.auto else "unsupported_runtime")
            applied = "forget" if auto.choice == "forget" or sync.plan.rotated is None else "amortize"
            if sync.auto is None and edits.auto:  # the model is not spliced: nothing was measured
                reason = sync.plan.reason
        if sync.fallback:  # saved rows could not be loaded: vLLM recomputed them (a full prefill)
            applied, reason = "forget", sync.fallback
        elif d.mode == "amortize" and end < edits.old_len:  # something follows the span: it had to rotate
            if not edits.rotate and not edits.auto:
                applied, reason = "forget", "a forget in the same batch recomputes what follows it"
            elif sync.plan.rotated is None:
                applied = "forget"
                reason = ("auto chose forget for the batch" if sync.auto is not None and sync.auto.choice == "forget"
                          else sync.plan.reason or "nothing after the edit to rotate")
        totals = i == 0
        outcomes.append(DirectiveOutcome(
            requested_mode=d.mode, applied_mode=applied, fallback_reason=reason, token_start=start,
            token_end=end, delta=new_len - (end - start),
            reused_tokens=sync.reused if totals else 0, rotated_tokens=sync.rotated if totals else 0,
            recomputed_tokens=recomputed if totals else 0, auto=auto))
    return outcomes


def edited(messages: list[Message], batch: DirectiveBatch) -> list[Message]:
    """The history after ``batch``; a bad batch raises a 4xx error and changes nothing."""
    for i, d in enumerate(batch.directives):
        if d.span.unit != "message":
            raise InvalidDirective(f"directive {i}: token spans are not supported on vLLM; use message spans")
    return apply_directives(messages, batch.directives)  # validates spans, overlaps
