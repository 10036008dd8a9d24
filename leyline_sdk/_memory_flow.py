"""The synchronisation flow of one LeylineMemory call, sans-I/O.

:class:`SyncFlow` is a generator of requests (:mod:`._memory_requests`: the
client calls it wants made, one class each); a driver (:mod:`._memory_drivers`)
makes them with the sync or the async client and sends back each answer, or
throws its error in. So the steps (adopt, build, plan, apply, append, generate)
and their recovery are written once for both clients.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._memory_requests import (
    Append,
    ApplyDirectives,
    CreateSession,
    DeleteSession,
    Generate,
    GetSession,
    SessionRequest,
)
from ._memory_stats import CallStats, EditRecord
from .batch_plan import BatchPlan, plan_batch
from .diff import apply_directives
from .errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    InvalidDirective,
    LeylineError,
    SessionExists,
    SessionNotFound,
    VersionConflict,
)
from .policy import EditContext, EditReason, ModePolicy, default_policy, explain_edit
from .protocol import (
    AppendResult,
    Directive,
    DirectiveOutcome,
    DirectiveResult,
    GenerateResponse,
    Message,
    SessionInfo,
)
from .tools_prompt import TOOLS_MESSAGE_ID

Op = Literal["defer", "append", "generate"]
# Why a session was rebuilt (CallStats.rebuild_reasons, X-Leyline-Rebuild): the server answered 404
# for a session this memory had (restart, eviction, deletion, a replica that never had it); the
# runtime refused a batch ("invalid_directive"); the edit needed more directives than a batch
# carries ("too_many_edits").
SESSION_NOT_FOUND = "session_not_found"
Flow = Generator[SessionRequest, Any, "Outcome"]


@dataclass
class Pending:
    """What the current model call has done so far (finalised by the generate)."""

    directives: int = 0
    edits: list[EditRecord] = field(default_factory=list)
    rotated: int = 0
    recomputed: int = 0
    prefilled: int = 0
    prefix_cache: int | None = None  # set by the call's first mutation
    built: bool = False
    resyncs: int = 0
    rebuilds: int = 0
    rebuild_reasons: list[str] = field(default_factory=list)

    def first_mutation(self, prefix: int) -> None:
        if self.prefix_cache is None:
            self.prefix_cache = prefix


@dataclass
class ThreadState:
    thread_id: str
    session_id: str
    shadow: list[Message] | None = None  # None: not known here (adopt it, or build it)
    version: int | None = None
    missing: bool = False  # known to be gone: build it without asking
    built_once: bool = False
    # this memory changed the session (built, edited, appended to or generated in it); until it does,
    # an adopted session holds only what an earlier run of the thread (or another process) left there
    written: bool = False
    # why the session this memory knew is gone (the next build is a rebuild, named by it)
    lost_reason: str | None = None
    pending: Pending = field(default_factory=Pending)
    calls: list[CallStats] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one call at a time

    def lost(self, reason: str) -> None:
        self.shadow, self.version, self.missing, self.lost_reason = None, None, True, reason

    def stale(self) -> None:
        self.shadow, self.version = None, None


@dataclass
class Outcome:
    directives: list[Directive]
    tail: list[Message]
    response: GenerateResponse | None = None
    call: CallStats | None = None


class _Retry(Exception):
    """A step lost the session or its version: start the next attempt."""


class SyncFlow:
    """Brings one thread's session to a view, then defers, appends or generates."""

    def __init__(self, th: ThreadState, *, policy: ModePolicy, max_attempts: int,
                 on_call: Callable[[CallStats, list[Message]], None] | None) -> None:
        self.th = th
        self.policy = policy
        self.max_attempts = max_attempts
        self.on_call = on_call
        self.sent: list[Directive] = []
        self.create_error: InvalidDirective | SessionExists | None = None

    def run(self, view_in: Sequence[Message | Mapping[str, Any]], *, op: Op, create: bool = True,
            keep_tools: bool = False, sampling: Mapping[str, Any] | None = None,
            message_id: str | None = None) -> Flow:
        th = self.th
        view = [m if isinstance(m, Message) else Message.model_validate(m) for m in view_in]
        lost_answer: LeylineError | None = None
        for _ in range(self.max_attempts):
            try:
                if th.shadow is None and not th.missing:
                    yield from self._adopt()
                if th.shadow is None:
                    if not create:
                        return Outcome([], [])
                    if not (yield from self._build(with_tools(view, None) if keep_tools else view)):
                        continue
                assert th.shadow is not None
                target = with_tools(view, th.shadow) if keep_tools else view
                plan = plan_batch(th.shadow, target, policy=self.policy)
                if plan.rebuild:  # too many edits for one batch: build the session afresh from the view
                    yield from self._drop("too_many_edits")
                    continue
                yield from self._apply(plan, target)
                if op == "defer":
                    return Outcome(self.sent, plan.tail)
                if op == "append":
                    yield from self._append(plan.tail)
                    return Outcome(self.sent, plan.tail)
                return (yield from self._generate(plan.tail, sampling, message_id))
            except _Retry:
                continue
            except (APIStatusError, APIConnectionError) as exc:
                if not answer_lost(exc):
                    raise
                # The replica died or restarted under the request: whether it ran is unknown. Re-read
                # the session (a replica that lost it answers 404 and it is rebuilt; one that ran the
                # request shows it, and the diff against the view takes it back).
                lost_answer = exc
                th.stale()
        if lost_answer is not None:
            raise lost_answer
        raise LeylineError(
            f"could not bring session {th.session_id} in step after {self.max_attempts} attempts")

    def _adopt(self) -> Generator[SessionRequest, Any, None]:
        """Known to the runtime but not to us (new process, conflict): adopt its messages."""
        th = self.th
        try:
            info = yield GetSession(th.session_id, include_messages=True)
        except SessionNotFound:
            if self.create_error is not None:
                raise self.create_error from None  # the create was refused for its content
            th.missing = True
            if th.built_once and th.lost_reason is None:  # it was there (a conflict re-read it): lost since
                th.lost_reason = SESSION_NOT_FOUND
        else:
            th.shadow, th.version, th.missing = list(info.messages or []), info.version, False
            th.pending.resyncs += 1

    def _build(self, target: list[Message]) -> Generator[SessionRequest, Any, bool]:
        th, p = self.th, self.th.pending
        # A rebuild names its reason, to the server too (X-Leyline-Rebuild: counted per replica).
        reason = th.lost_reason or (SESSION_NOT_FOUND if th.built_once else None)
        try:
            info = yield CreateSession(th.session_id, target, rebuild_reason=reason)
        except (SessionExists, InvalidDirective) as exc:  # created meanwhile by someone else? adopt it
            th.missing, self.create_error = False, exc
            return False
        th.shadow, th.version, th.missing, th.lost_reason = list(target), info.version, False, None
        p.prefilled += info.num_tokens
        p.prefix_cache = 0  # a fresh session has nothing cached
        p.built = True
        if reason is not None:
            p.rebuilds += 1
            p.rebuild_reasons.append(reason)
        th.built_once = th.written = True
        return True

    def _drop(self, reason: str) -> Generator[SessionRequest, Any, None]:
        """Delete the session, so the next attempt builds it from the view."""
        with contextlib.suppress(SessionNotFound):
            yield DeleteSession(self.th.session_id)
        self.th.lost(reason)

    def _apply(self, plan: BatchPlan, target: list[Message]) -> Generator[SessionRequest, Any, None]:
        th = self.th
        assert th.shadow is not None
        directives, local = plan.directives, plan.local
        if not directives:
            if local:
                th.shadow = apply_directives(th.shadow, local)
            return
        prefix_floor = 0
        k = common_prefix(th.shadow, target)
        if k > min(d.span.start for d in directives):
            # Messages equal up to k although the diff edits earlier (duplicates):
            # a prefix cache reuses them; find their tokens in the segment table.
            seg_info: SessionInfo = yield from self._call(GetSession(th.session_id))
            prefix_floor = segment_offset(seg_info, k)
        try:
            result: DirectiveResult = yield from self._call(
                ApplyDirectives(th.session_id, directives, expected_version=th.version))
        except InvalidDirective:
            # The runtime refuses this batch: start the session afresh from the view.
            yield from self._drop("invalid_directive")
            raise _Retry from None
        record(th.pending, th.shadow, directives, result, prefix_floor, explain=self.policy is default_policy,
               inherited=not th.written)
        self.sent.extend(directives)
        th.shadow = apply_directives(th.shadow, [*directives, *local])
        th.version, th.written = result.version, True

    def _append(self, tail: list[Message]) -> Generator[SessionRequest, Any, None]:
        th = self.th
        if not tail:
            return
        appended: AppendResult = yield from self._call(
            Append(th.session_id, tail, expected_version=th.version))
        th.pending.prefilled += appended.usage.prefill_tokens
        th.pending.first_mutation(appended.usage.cached_tokens)
        th.shadow = [*(th.shadow or []), *tail]
        th.version, th.written = appended.version, True

    def _generate(self, tail: list[Message], sampling: Mapping[str, Any] | None,
                  message_id: str | None) -> Flow:
        th = self.th
        response: GenerateResponse = yield from self._call(
            Generate(th.session_id, tail, expected_version=th.version, sampling=dict(sampling or {})))
        message = response.message.model_copy(update={"id": message_id})
        response = response.model_copy(update={"message": message})
        th.shadow = [*(th.shadow or []), *tail, message]
        th.version, th.written = response.version, True
        usage = response.usage
        th.pending.prefilled += usage.prefill_tokens
        th.pending.first_mutation(usage.cached_tokens)
        call = finish_call(th, usage.prompt_tokens, usage.completion_tokens)
        if self.on_call is not None:
            self.on_call(call, th.shadow[:-1])
        return Outcome(self.sent, tail, response, call)

    def _call(self, request: SessionRequest) -> Generator[SessionRequest, Any, Any]:
        """One call on the session: a lost session or a stale version retries the flow."""
        try:
            return (yield request)
        except SessionNotFound:
            # restarted, evicted, deleted, or (behind a router) a replica that never had it
            self.th.lost(SESSION_NOT_FOUND)
            raise _Retry from None
        except VersionConflict:
            self.th.stale()
            raise _Retry from None


def answer_lost(exc: LeylineError) -> bool:
    """A request whose answer never came: a router's 502 (its replica refused or dropped it), or the
    connection dropped after the request went out. Not a timeout: that request may still be running."""
    if isinstance(exc, APIStatusError):
        return exc.status_code == 502
    return isinstance(exc, APIConnectionError) and not isinstance(exc, APITimeoutError)


def with_tools(view: list[Message], shadow: list[Message] | None) -> list[Message]:
    """The view with the session's tools message kept in front (see ``keep_tools_message``)."""
    if view and view[0].id == TOOLS_MESSAGE_ID:
        return view
    if shadow and shadow[0].id == TOOLS_MESSAGE_ID:
        return [shadow[0], *view]
    return view


def record(p: Pending, old: list[Message], directives: list[Directive], result: DirectiveResult,
           prefix_floor: int, *, explain: bool, inherited: bool) -> None:
    """Count a batch the runtime applied into the call's pending statistics.

    ``inherited``: ``old`` is a session this memory adopted and has not written to yet."""
    outcomes: list[DirectiveOutcome] = result.outcomes
    ordered = sorted(zip(directives, outcomes), key=lambda pair: pair[0].span.start)
    p.directives += len(directives)
    for d, o in ordered:
        reason: EditReason | None = None
        if explain:
            reason = explain_edit(EditContext(
                old_messages=tuple(old[d.span.start:d.span.end]),
                new_messages=tuple(d.replacement),  # type: ignore[arg-type]
                start=d.span.start, total_messages=len(old)))[1]
            if inherited and reason in ("user_correction", "retraction"):
                # The turns this drops were never this memory's: an earlier run of the thread left them
                # (a script run twice, a restarted process starting its conversation over). Forget, as
                # the rule says, but named for what it is, not as the user correcting themselves.
                reason = "rerun"
        p.edits.append(EditRecord(
            start=d.span.start, end=d.span.end, replacement=len(d.replacement),
            requested_mode=o.requested_mode, applied_mode=o.applied_mode,
            fallback_reason=o.fallback_reason, token_start=o.token_start,
            token_end=o.token_end, delta=o.delta, reason=reason))
        p.rotated += o.rotated_tokens
        p.recomputed += o.recomputed_tokens
    first_changed = min((o.token_start for o in outcomes), default=0)
    p.first_mutation(max(first_changed, prefix_floor))


def finish_call(th: ThreadState, prompt_tokens: int, completion_tokens: int) -> CallStats:
    p = th.pending
    reused = max(0, prompt_tokens - p.rotated - p.recomputed - p.prefilled)
    call = CallStats(
        thread_id=th.thread_id, session_id=th.session_id, directives=p.directives, edits=p.edits,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, reused_tokens=reused,
        rotated_tokens=p.rotated, recomputed_tokens=p.recomputed, prefilled_tokens=p.prefilled,
        prefix_cache_tokens=p.prefix_cache or 0, built=p.built, resyncs=p.resyncs, rebuilds=p.rebuilds,
        rebuild_reasons=list(p.rebuild_reasons))
    th.calls.append(call)
    th.pending = Pending()
    return call


def common_prefix(old: Sequence[Message], new: Sequence[Message]) -> int:
    k = 0
    while k < min(len(old), len(new)) and old[k].fingerprint() == new[k].fingerprint():
        k += 1
    return k


def segment_offset(info: SessionInfo, k: int) -> int:
    if k < len(info.segments):
        return info.segments[k].start
    return info.num_tokens
