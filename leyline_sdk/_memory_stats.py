"""What LeylineMemory counts: one directive as sent, one model call, a thread's totals."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .protocol import AppliedMode, Mode

__all__ = ["CallStats", "EditRecord", "ThreadStats", "TokenTally"]


@dataclass(frozen=True)
class EditRecord:
    """One directive as sent and what the runtime did with it."""

    start: int  # message span in the session as it was before the batch
    end: int
    replacement: int  # number of messages in its place
    requested_mode: Mode
    applied_mode: AppliedMode
    fallback_reason: str | None
    token_start: int
    token_end: int
    delta: int
    # the default policy's rule (None under another policy); "rerun" when it dropped turns an earlier run
    # of the thread left in the session (policy.EditReason)
    reason: str | None = None


@dataclass
class TokenTally:
    """Token counters shared by one call's and one thread's statistics."""

    directives: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0
    rotated_tokens: int = 0
    recomputed_tokens: int = 0
    prefilled_tokens: int = 0
    prefix_cache_tokens: int = 0
    resyncs: int = 0  # times the session was re-read (version conflict, adoption)
    rebuilds: int = 0  # times a lost or refused session was rebuilt

    @property
    def leyline_reused_tokens(self) -> int:
        """Prompt tokens the runtime did not compute (kept + rotated)."""
        return self.reused_tokens + self.rotated_tokens

    @property
    def reprefill_tokens(self) -> int:
        """What a full re-prefill of the prompt(s) would have cost."""
        return self.prompt_tokens

    @property
    def computed_tokens(self) -> int:
        return self.recomputed_tokens + self.prefilled_tokens


@dataclass(kw_only=True)
class CallStats(TokenTally):
    """One model call: what it cost and what it would have cost.

    ``prompt_tokens`` is the prompt the model attended to (the session's tokens
    plus the assistant header). ``reused + rotated + recomputed + prefilled ==
    prompt_tokens`` for a call that needed no recovery: ``reused`` rows were
    kept bit-for-bit, ``rotated`` rows were kept and moved (rope keys rotated),
    ``recomputed`` were prefilled again because of an edit (replacements, and
    everything after a ``forget``), ``prefilled`` are new (appended messages,
    the assistant header, or the whole history when the session was built).
    ``prefix_cache_tokens``: what a prefix cache alone would have reused — the
    session's tokens before the first token that differs, measured by the
    runtime (the first edited token after its token-level minimisation, or the
    whole session when the call only appended; 0 when the session was built).
    """

    thread_id: str
    session_id: str
    edits: list[EditRecord] = field(default_factory=list)
    built: bool = False  # the session was created (first call or rebuild) during this call
    # one per rebuild: "session_not_found" (the server lost it, or a replica never had it),
    # "invalid_directive" (a batch refused), "too_many_edits" (more edits than one batch carries)
    rebuild_reasons: list[str] = field(default_factory=list)


@dataclass
class ThreadStats(TokenTally):
    """Totals over a thread's model calls (and directives sent so far)."""

    model_calls: int = 0
    rebuild_reasons: dict[str, int] = field(default_factory=dict)  # rebuilds by reason

    def add(self, call: CallStats) -> None:
        for f in fields(TokenTally):
            setattr(self, f.name, getattr(self, f.name) + getattr(call, f.name))
        self.model_calls += 1
        for reason in call.rebuild_reasons:
            self.rebuild_reasons[reason] = self.rebuild_reasons.get(reason, 0) + 1
