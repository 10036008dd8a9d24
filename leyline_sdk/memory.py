"""LeylineMemory: one runtime session per conversation thread, kept in step by directives.

An agent framework hands over the whole history it wants the model to see
(the *view*) at every model call. ``LeylineMemory`` keeps, per thread, a
*shadow* of what the runtime's session holds — the messages last sent plus the
assistant messages the runtime generated — diffs each new view against it
(:func:`~leyline_sdk.diff.split_append`), sends the edits as one directive
batch (``expected_version`` guarded) and only the new messages after them.
A warm session never receives its whole history again.

It heals itself: a session that is gone (runtime restarted, evicted, deleted)
is rebuilt from the full view; a version conflict (someone else changed the
session) re-reads the session's messages and diffs again; a batch the runtime
refuses as invalid rebuilds the session.

Pure pydantic + httpx like the rest of the SDK; it imports no adapter. The
LangChain / LangGraph adapter builds itself from a memory
(``ChatLeyline.from_memory(memory)``) and finds a call's thread id itself.

Calls on one thread are serialised (a lock per thread, held by sync and async
calls alike), so ``batch``/``abatch`` or concurrent requests on one memory
never interleave their steps; different threads run concurrently.

    memory = LeylineMemory(LeylineClient())
    reply = memory.generate("thread-1", view, max_tokens=256)   # view: list[Message]
    memory.stats("thread-1").reprefill_tokens                  # what full re-prefills would cost
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ._base import StreamEvent
from .client import AsyncLeylineClient, LeylineClient
from .diff import apply_directives, split_append
from .errors import InvalidDirective, LeylineError, SessionNotFound, VersionConflict
from .policy import EditContext, ModePolicy, default_policy, explain_edit
from .protocol import (
    AppendResult,
    AppliedMode,
    MAX_ID_LENGTH,
    SESSION_ID_PATTERN,
    Directive,
    DirectiveOutcome,
    DirectiveResult,
    GenerateResponse,
    Message,
    Mode,
    SessionInfo,
    Span,
)
from .tools_prompt import TOOLS_MESSAGE_ID

__all__ = ["TOOLS_MESSAGE_ID", "CallStats", "EditRecord", "LeylineMemory", "ThreadStats"]

# Id of the system message that lists the tools (the runtime's /v1 path uses the same).

SAMPLING_KEYS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs", "top_logprobs",
     "tools", "tool_choice", "parallel_tool_calls", "response_format"})


Op = Literal["defer", "append", "generate"]


# --- counters -------------------------------------------------------------------------


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
    reason: str | None = None  # the default policy's rule (None under another policy)


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


@dataclass
class ThreadStats(TokenTally):
    """Totals over a thread's model calls (and directives sent so far)."""

    model_calls: int = 0

    def add(self, call: CallStats) -> None:
        for f in fields(TokenTally):
            setattr(self, f.name, getattr(self, f.name) + getattr(call, f.name))
        self.model_calls += 1


@dataclass
class _Pending:
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

    def first_mutation(self, prefix: int) -> None:
        if self.prefix_cache is None:
            self.prefix_cache = prefix


@dataclass
class _Thread:
    thread_id: str
    session_id: str
    shadow: list[Message] | None = None  # None: not known here (adopt it, or build it)
    version: int | None = None
    missing: bool = False  # known to be gone: build it without asking
    built_once: bool = False
    pending: _Pending = field(default_factory=_Pending)
    calls: list[CallStats] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one call at a time

    def lost(self) -> None:
        self.shadow, self.version, self.missing = None, None, True

    def stale(self) -> None:
        self.shadow, self.version = None, None


@dataclass
class _Req:
    """One client call the synchronisation flow wants made (sans-I/O)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Outcome:
    directives: list[Directive]
    tail: list[Message]
    response: GenerateResponse | None = None
    call: CallStats | None = None


# --- the memory --------------------------------------------------------------------------


class LeylineMemory:
    """One runtime session per thread, a shadow of it, a mode policy and counters.

    ``client`` is a :class:`LeylineClient` (used by the sync paths) or an
    :class:`AsyncLeylineClient`; ``async_client`` adds the async one. The async
    paths fall back to running the sync client in a worker thread when no async
    client is given. ``on_call(call, prompt)`` runs after every model call with
    its :class:`CallStats` and the messages its prompt held.
    """

    def __init__(
        self,
        client: LeylineClient | AsyncLeylineClient | None = None,
        *,
        policy: ModePolicy = default_policy,
        async_client: AsyncLeylineClient | None = None,
        session_prefix: str = "lg-",
        default_thread_id: str | None = None,
        placeholder: str = "[cleared]",
        max_attempts: int = 4,
        on_call: Callable[[CallStats, list[Message]], None] | None = None,
    ) -> None:
        if isinstance(client, AsyncLeylineClient):
            if async_client is not None:
                raise TypeError("pass one async client")
            client, async_client = None, client
        if client is None and async_client is None:
            client = LeylineClient()
        self.client: LeylineClient | None = client
        self.async_client: AsyncLeylineClient | None = async_client
        self.policy = policy
        self.session_prefix = session_prefix
        # per memory, never a session shared by every process that forgot a thread id
        self.default_thread_id = default_thread_id or f"default-{uuid.uuid4().hex[:12]}"
        self.placeholder = placeholder
        self.max_attempts = max_attempts
        self.on_call = on_call
        self._threads: dict[str, _Thread] = {}
        self._lock = threading.Lock()

    # -- threads ----------------------------------------------------------------------

    def session_id(self, thread_id: str) -> str:
        """The runtime session id of a thread: ``session_prefix + thread_id``.

        Raises ValueError unless the result is a valid session id: letters, digits
        and ``. _ : @ -``, starting with a letter or digit, at most 128 characters."""
        session = f"{self.session_prefix}{thread_id}"
        if not re.fullmatch(SESSION_ID_PATTERN, session):
            raise ValueError(
                f"thread id {thread_id!r} cannot name a session: {session!r} must be 1-{MAX_ID_LENGTH} "
                "characters of letters, digits and . _ : @ -, starting with a letter or digit")
        return session

    def shadow(self, thread_id: str) -> list[Message] | None:
        """What this memory believes the thread's session holds (``None``: not known yet)."""
        th = self._threads.get(thread_id)
        return list(th.shadow) if th is not None and th.shadow is not None else None

    def calls(self, thread_id: str) -> list[CallStats]:
        th = self._threads.get(thread_id)
        return list(th.calls) if th is not None else []

    def last_call(self, thread_id: str) -> CallStats | None:
        th = self._threads.get(thread_id)
        return th.calls[-1] if th is not None and th.calls else None

    def stats(self, thread_id: str | None = None) -> ThreadStats:
        """Totals for one thread, or over all threads."""
        total = ThreadStats()
        threads = [self._threads[thread_id]] if thread_id in self._threads else (
            [] if thread_id is not None else list(self._threads.values()))
        for th in threads:
            for call in th.calls:
                total.add(call)
            total.directives += th.pending.directives  # sent, call not finished yet
        return total

    def threads(self) -> list[str]:
        return list(self._threads)

    def forget_thread(self, thread_id: str) -> None:
        """Drop the local state of a thread (the runtime session stays; it is adopted again)."""
        with self._lock:
            self._threads.pop(thread_id, None)

    def reset(self, thread_id: str) -> None:
        """Delete the thread's runtime session and its local state."""
        th = self._thread(thread_id)
        with contextlib.suppress(SessionNotFound):
            self._sync_client().delete_session(th.session_id)
        self.forget_thread(thread_id)

    async def areset(self, thread_id: str) -> None:
        th = self._thread(thread_id)
        with contextlib.suppress(SessionNotFound):
            await self._call_async(_Req("delete_session", (th.session_id,)))
        self.forget_thread(thread_id)

    # -- synchronising ----------------------------------------------------------------

    def sync(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        append_tail: bool = True,
        create: bool = True,
        keep_tools_message: bool = False,
    ) -> tuple[list[Directive], list[Message]]:
        """Bring the thread's session to ``view``; ``(directives applied, tail)``.

        Edits go as one directive batch; the tail (messages after the last one
        the session already holds) is appended too unless ``append_tail`` is
        false — then it is left for the next :meth:`generate` to carry.
        ``create=False`` leaves a session that does not exist yet alone (the
        next generate builds it with the full view). ``keep_tools_message``:
        the view has no tools message of its own; keep the session's.
        """
        op: Op = "append" if append_tail else "defer"
        out = self._run(thread_id, self._flow(thread_id, view, op=op, create=create, keep_tools=keep_tools_message))
        return out.directives, out.tail

    async def async_sync(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        append_tail: bool = True,
        create: bool = True,
        keep_tools_message: bool = False,
    ) -> tuple[list[Directive], list[Message]]:
        op: Op = "append" if append_tail else "defer"
        out = await self._arun(thread_id, self._flow(thread_id, view, op=op, create=create,
                                                     keep_tools=keep_tools_message))
        return out.directives, out.tail

    def generate(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        message_id: str | None = None,
        **sampling: Any,
    ) -> GenerateResponse:
        """Sync the session to ``view`` and generate the next assistant message.

        The returned message carries ``message_id`` (the id the caller will give
        it, e.g. the LangChain message id), and so does the shadow.
        """
        out = self._run(thread_id, self._flow(thread_id, view, op="generate", sampling=_sampling(sampling),
                                              message_id=message_id))
        assert out.response is not None
        return out.response

    async def agenerate(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        message_id: str | None = None,
        **sampling: Any,
    ) -> GenerateResponse:
        out = await self._arun(thread_id, self._flow(thread_id, view, op="generate",
                                                     sampling=_sampling(sampling), message_id=message_id))
        assert out.response is not None
        return out.response

    def generate_stream(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        message_id: str | None = None,
        **sampling: Any,
    ) -> Iterator[StreamEvent]:
        """:meth:`generate`, streamed: the text as it is generated (``str`` deltas), then the
        :class:`GenerateResponse` as :meth:`generate` returns it.

        The thread stays locked until the iterator is exhausted or closed. Recovery
        (rebuild, resync) happens as in :meth:`generate` as long as no text was
        streamed; an error after the first delta is raised as is.
        """
        flow = self._flow(thread_id, view, op="generate", sampling=_sampling(sampling), message_id=message_id)
        with self._thread(thread_id).lock:
            out = yield from self._drive(flow, stream=True)
        assert out.response is not None
        yield out.response

    async def agenerate_stream(
        self,
        thread_id: str,
        view: Sequence[Message | Mapping[str, Any]],
        *,
        message_id: str | None = None,
        **sampling: Any,
    ) -> AsyncIterator[StreamEvent]:
        """:meth:`generate_stream`, async."""
        flow = self._flow(thread_id, view, op="generate", sampling=_sampling(sampling), message_id=message_id)
        async with self._locked(thread_id), contextlib.aclosing(self._adrive(flow, stream=True)) as steps:
            async for event in steps:
                if isinstance(event, _Outcome):
                    assert event.response is not None
                    yield event.response
                else:
                    yield event

    def note_response_id(self, thread_id: str, message_id: str | None, fingerprint: tuple | None = None) -> None:
        """The framework gave the generated message another id: record it in the shadow.

        Ids do not render, so nothing is sent; this only keeps the next diff
        matching by id. ``fingerprint`` guards against renaming the wrong message.
        """
        th = self._threads.get(thread_id)
        if th is None or not th.shadow or message_id is None:
            return
        last = th.shadow[-1]
        if last.role != "assistant" or last.id == message_id:
            return
        if fingerprint is not None and last.fingerprint() != fingerprint:
            return
        th.shadow[-1] = last.model_copy(update={"id": message_id})

    # -- the flow (one implementation, driven sync or async) ----------------------------

    def _thread(self, thread_id: str) -> _Thread:
        with self._lock:
            th = self._threads.get(thread_id)
            if th is None:
                th = self._threads[thread_id] = _Thread(thread_id, self.session_id(thread_id))
            return th

    def _flow(
        self,
        thread_id: str,
        view_in: Sequence[Message | Mapping[str, Any]],
        *,
        op: Op,
        create: bool = True,
        keep_tools: bool = False,
        sampling: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> Generator[_Req, Any, _Outcome]:
        th = self._thread(thread_id)
        p = th.pending
        view = [m if isinstance(m, Message) else Message.model_validate(m) for m in view_in]
        sent: list[Directive] = []
        create_error: InvalidDirective | None = None
        for _ in range(self.max_attempts):
            if th.shadow is None and not th.missing:
                try:  # known to the runtime but not to us (new process, conflict): adopt it
                    info = yield _Req("get_session", (th.session_id,), {"include_messages": True})
                except SessionNotFound:
                    if create_error is not None:
                        raise create_error from None  # the create was refused for its content
                    th.missing = True
                else:
                    th.shadow, th.version, th.missing = list(info.messages or []), info.version, False
                    p.resyncs += 1
            if th.shadow is None:
                if not create:
                    return _Outcome([], [])
                target = self._with_tools(view, None) if keep_tools else view
                try:
                    info = yield _Req("create_session", (target,), {"session_id": th.session_id})
                except InvalidDirective as exc:  # created meanwhile by someone else? adopt it
                    th.missing, create_error = False, exc
                    continue
                th.shadow, th.version, th.missing = list(target), info.version, False
                p.prefilled += info.num_tokens
                p.prefix_cache = 0  # a fresh session has nothing cached
                p.built = True
                if th.built_once:
                    p.rebuilds += 1
                th.built_once = True
            target = self._with_tools(view, th.shadow) if keep_tools else view
            directives, local, tail = self._plan(th.shadow, target)
            if directives:
                prefix_floor = 0
                k = _common_prefix(th.shadow, target)
                if k > min(d.span.start for d in directives):
                    # Messages equal up to k although the diff edits earlier (duplicates):
                    # a prefix cache reuses them; find their tokens in the segment table.
                    try:
                        seg_info: SessionInfo = yield _Req("get_session", (th.session_id,))
                        prefix_floor = _offset(seg_info, k)
                    except SessionNotFound:
                        th.lost()
                        continue
                try:
                    result: DirectiveResult = yield _Req(
                        "apply", (th.session_id, directives), {"expected_version": th.version})
                except SessionNotFound:
                    th.lost()
                    continue
                except VersionConflict:
                    th.stale()
                    continue
                except InvalidDirective:
                    # The runtime refuses this batch: start the session afresh from the view.
                    with contextlib.suppress(SessionNotFound):
                        yield _Req("delete_session", (th.session_id,))
                    th.lost()
                    continue
                self._record(p, th.shadow, directives, result, prefix_floor)
                sent.extend(directives)
                th.shadow = apply_directives(th.shadow, [*directives, *local])
                th.version = result.version
            elif local:
                th.shadow = apply_directives(th.shadow, local)
            if op == "defer":
                return _Outcome(sent, tail)
            if op == "append":
                if tail:
                    try:
                        appended: AppendResult = yield _Req(
                            "append", (th.session_id, tail), {"expected_version": th.version})
                    except SessionNotFound:
                        th.lost()
                        continue
                    except VersionConflict:
                        th.stale()
                        continue
                    p.prefilled += appended.usage.prefill_tokens
                    p.first_mutation(appended.usage.cached_tokens)
                    th.shadow = [*th.shadow, *tail]
                    th.version = appended.version
                return _Outcome(sent, tail)
            try:
                response: GenerateResponse = yield _Req(
                    "generate", (th.session_id, tail),
                    {"expected_version": th.version, **(sampling or {})})
            except SessionNotFound:
                th.lost()
                continue
            except VersionConflict:
                th.stale()
                continue
            message = response.message.model_copy(update={"id": message_id})
            response = response.model_copy(update={"message": message})
            th.shadow = [*th.shadow, *tail, message]
            th.version = response.version
            usage = response.usage
            p.prefilled += usage.prefill_tokens
            p.first_mutation(usage.cached_tokens)
            call = self._finish_call(th, usage.prompt_tokens, usage.completion_tokens)
            if self.on_call is not None:
                self.on_call(call, th.shadow[:-1])
            return _Outcome(sent, tail, response, call)
        raise LeylineError(
            f"could not bring session {th.session_id} in step after {self.max_attempts} attempts")

    def _with_tools(self, view: list[Message], shadow: list[Message] | None) -> list[Message]:
        """The view with the session's tools message kept in front (see ``keep_tools_message``)."""
        if view and view[0].id == TOOLS_MESSAGE_ID:
            return view
        if shadow and shadow[0].id == TOOLS_MESSAGE_ID:
            return [shadow[0], *view]
        return view

    def _plan(self, old: list[Message], new: list[Message]) -> tuple[list[Directive], list[Directive], list[Message]]:
        """``(directives to send, id-only changes, tail)``.

        A replacement that renders exactly like what it replaces (only ids
        differ) costs the runtime nothing and is applied to the shadow only.
        Touching edits inside one tool unit become one directive.
        """
        directives, tail = split_append(old, new, policy=self.policy)
        send: list[Directive] = []
        local: list[Directive] = []
        for d in directives:
            before = [m.fingerprint() for m in old[d.span.start:d.span.end]]
            after = [m.fingerprint() for m in d.replacement]  # type: ignore[union-attr]
            (local if before == after else send).append(d)
        return self._merge_units(old, send), local, tail

    def _merge_units(self, old: list[Message], directives: list[Directive]) -> list[Directive]:
        """Edit a tool call and its results as a unit: merge directives that touch inside one."""
        merged: list[Directive] = []
        for d in sorted(directives, key=lambda d: (d.span.start, d.span.end)):
            prev = merged[-1] if merged else None
            if (prev is not None and prev.span.end == d.span.start
                    and prev.span.end > prev.span.start and d.span.end > d.span.start
                    and _unit(old, prev.span.end - 1) is not None
                    and _unit(old, prev.span.end - 1) == _unit(old, d.span.start)):
                replacement = [*prev.replacement, *d.replacement]
                edit = EditContext(old_messages=tuple(old[prev.span.start:d.span.end]),
                                   new_messages=tuple(replacement), start=prev.span.start,
                                   total_messages=len(old))
                merged[-1] = Directive(span=Span(start=prev.span.start, end=d.span.end),
                                       replacement=replacement, mode=self.policy(edit))
            else:
                merged.append(d)
        return merged

    def _record(self, p: _Pending, old: list[Message], directives: list[Directive],
                result: DirectiveResult, prefix_floor: int) -> None:
        outcomes: list[DirectiveOutcome] = result.outcomes
        ordered = sorted(zip(directives, outcomes), key=lambda pair: pair[0].span.start)
        p.directives += len(directives)
        for d, o in ordered:
            reason = None
            if self.policy is default_policy:
                reason = explain_edit(EditContext(
                    old_messages=tuple(old[d.span.start:d.span.end]),
                    new_messages=tuple(d.replacement),  # type: ignore[arg-type]
                    start=d.span.start, total_messages=len(old)))[1]
            p.edits.append(EditRecord(
                start=d.span.start, end=d.span.end, replacement=len(d.replacement),
                requested_mode=o.requested_mode, applied_mode=o.applied_mode,
                fallback_reason=o.fallback_reason, token_start=o.token_start,
                token_end=o.token_end, delta=o.delta, reason=reason))
            p.rotated += o.rotated_tokens
            p.recomputed += o.recomputed_tokens
        first_changed = min((o.token_start for o in outcomes), default=0)
        p.first_mutation(max(first_changed, prefix_floor))

    def _finish_call(self, th: _Thread, prompt_tokens: int, completion_tokens: int) -> CallStats:
        p = th.pending
        reused = max(0, prompt_tokens - p.rotated - p.recomputed - p.prefilled)
        call = CallStats(
            thread_id=th.thread_id, session_id=th.session_id, directives=p.directives, edits=p.edits,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, reused_tokens=reused,
            rotated_tokens=p.rotated, recomputed_tokens=p.recomputed, prefilled_tokens=p.prefilled,
            prefix_cache_tokens=p.prefix_cache or 0, built=p.built, resyncs=p.resyncs, rebuilds=p.rebuilds)
        th.calls.append(call)
        th.pending = _Pending()
        return call

    # -- drivers --------------------------------------------------------------------------

    def _sync_client(self) -> LeylineClient:
        if self.client is None:
            raise TypeError("this LeylineMemory has only an async client; use the async methods "
                            "(ainvoke/astream) or give it a LeylineClient")
        return self.client

    def _run(self, thread_id: str, flow: Generator[_Req, Any, _Outcome]) -> _Outcome:
        with self._thread(thread_id).lock:
            steps = self._drive(flow, stream=False)
            while True:
                try:
                    next(steps)
                except StopIteration as stop:
                    return stop.value

    def _drive(self, flow: Generator[_Req, Any, _Outcome], stream: bool) -> Generator[str, None, _Outcome]:
        """Make the flow's calls; with ``stream`` the generate is streamed and its deltas yielded."""
        client = self._sync_client()
        value: Any = None
        error: LeylineError | None = None
        streamed = False
        while True:
            try:
                req = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value
            try:
                if stream and req.method == "generate":
                    for event in client.generate_stream(*req.args, **req.kwargs):
                        if isinstance(event, GenerateResponse):
                            value = event
                        else:
                            streamed = True
                            yield event
                else:
                    value = getattr(client, req.method)(*req.args, **req.kwargs)
                error = None
            except LeylineError as exc:
                if streamed:
                    raise  # text went out: no recovery can take it back
                value, error = None, exc

    @contextlib.asynccontextmanager
    async def _locked(self, thread_id: str) -> AsyncIterator[None]:
        lock = self._thread(thread_id).lock
        while not lock.acquire(blocking=False):  # a threading lock: sync callers hold it too
            await asyncio.sleep(0.005)
        try:
            yield
        finally:
            lock.release()

    async def _arun(self, thread_id: str, flow: Generator[_Req, Any, _Outcome]) -> _Outcome:
        async with self._locked(thread_id), contextlib.aclosing(self._adrive(flow, stream=False)) as steps:
            async for event in steps:
                if isinstance(event, _Outcome):
                    return event
        raise AssertionError("the flow ended without an outcome")

    async def _adrive(self, flow: Generator[_Req, Any, _Outcome], stream: bool) -> AsyncGenerator[str | _Outcome, None]:
        """:meth:`_drive`, async: yields the deltas, then the flow's outcome."""
        value: Any = None
        error: LeylineError | None = None
        streamed = False
        while True:
            try:
                req = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                yield stop.value
                return
            try:
                if stream and req.method == "generate":
                    async for event in self._agenerate_stream(req):
                        if isinstance(event, GenerateResponse):
                            value = event
                        else:
                            streamed = True
                            yield event
                else:
                    value = await self._call_async(req)
                error = None
            except LeylineError as exc:
                if streamed:
                    raise
                value, error = None, exc

    async def _agenerate_stream(self, req: _Req) -> AsyncIterator[StreamEvent]:
        if self.async_client is not None:
            async for event in self.async_client.generate_stream(*req.args, **req.kwargs):
                yield event
            return
        # only a sync client: stream it from a worker thread
        events = self._sync_client().generate_stream(*req.args, **req.kwargs)

        def step() -> StreamEvent | None:
            return next(events, None)

        while (item := await asyncio.to_thread(step)) is not None:
            yield item

    async def _call_async(self, req: _Req) -> Any:
        if self.async_client is not None:
            return await getattr(self.async_client, req.method)(*req.args, **req.kwargs)
        method = getattr(self._sync_client(), req.method)
        return await asyncio.to_thread(method, *req.args, **req.kwargs)


# --- helpers -------------------------------------------------------------------------------


def _sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(params) - SAMPLING_KEYS
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    return {k: v for k, v in params.items() if v is not None}


def _common_prefix(old: Sequence[Message], new: Sequence[Message]) -> int:
    k = 0
    while k < min(len(old), len(new)) and old[k].fingerprint() == new[k].fingerprint():
        k += 1
    return k


def _offset(info: SessionInfo, k: int) -> int:
    if k < len(info.segments):
        return info.segments[k].start
    return info.num_tokens


def _unit(messages: Sequence[Message], i: int) -> int | None:
    """Index of the assistant message whose tool unit holds message ``i`` (or ``None``)."""
    m = messages[i]
    if m.role == "assistant" and m.tool_calls:
        return i
    if m.role != "tool":
        return None
    j = i
    while j > 0 and messages[j].role == "tool":
        j -= 1
    opener = messages[j]
    return j if opener.role == "assistant" and opener.tool_calls else None

