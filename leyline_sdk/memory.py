"""LeylineMemory: one runtime session per conversation thread, kept in step by directives.

An agent framework hands over the whole history it wants the model to see
(the *view*) at every model call. ``LeylineMemory`` keeps, per thread, a
*shadow* of what the runtime's session holds — the messages last sent plus the
assistant messages the runtime generated — diffs each new view against it
(:func:`~leyline_sdk.batch_plan.plan_batch`), sends the edits as one directive
batch (``expected_version`` guarded) and only the new messages after them.
A warm session never receives its whole history again.

It heals itself: a session that is gone (runtime restarted, evicted, deleted)
is rebuilt from the full view; a version conflict (someone else changed the
session) re-reads the session's messages and diffs again; a batch the runtime
refuses as invalid rebuilds the session; an answer lost on the way (a router's
502, a dropped connection: the replica died under the request) re-reads the
session too, so what the request did or did not do is diffed against the view.
Behind a session-affinity router (docs/vllm.md, Replicas) a replica that does
not hold the session answers 404 and it is rebuilt there, named
(``CallStats.rebuild_reasons``).

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

import contextlib
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from ._calls import GENERATE_OPTIONS
from ._memory_drivers import AsyncDriver, SyncDriver, held
from ._memory_flow import Flow, Op, Outcome, SyncFlow, ThreadState
from ._memory_requests import DeleteSession
from ._memory_stats import CallStats, EditRecord, ThreadStats, TokenTally
from ._streaming import StreamEvent
from .client import AsyncLeylineClient, LeylineClient
from .errors import SessionNotFound
from .policy import ModePolicy, default_policy
from .protocol import SESSION_ID_PATTERN, SESSION_ID_RULE, Directive, GenerateResponse, Message
from .tools_prompt import TOOLS_MESSAGE_ID

__all__ = ["TOOLS_MESSAGE_ID", "CallStats", "EditRecord", "LeylineMemory", "ThreadStats", "TokenTally"]


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
        self._threads: dict[str, ThreadState] = {}
        self._lock = threading.Lock()

    # -- threads ----------------------------------------------------------------------

    def session_id(self, thread_id: str) -> str:
        """The runtime session id of a thread: ``session_prefix + thread_id``.

        Raises ValueError, naming :data:`~leyline_sdk.protocol.SESSION_ID_RULE`, unless the
        result is a valid session id."""
        session = f"{self.session_prefix}{thread_id}"
        if not re.fullmatch(SESSION_ID_PATTERN, session):
            raise ValueError(f"thread id {thread_id!r} cannot name a session: {session!r} must be {SESSION_ID_RULE}")
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
            self._sync_driver().send(DeleteSession(th.session_id))
        self.forget_thread(thread_id)

    async def areset(self, thread_id: str) -> None:
        th = self._thread(thread_id)
        with contextlib.suppress(SessionNotFound):
            await self._async_driver().send(DeleteSession(th.session_id))
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
        out = self._sync_driver().run(self._thread(thread_id).lock, self._flow(
            thread_id, view, op=op, create=create, keep_tools=keep_tools_message))
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
        out = await self._async_driver().run(self._thread(thread_id).lock, self._flow(
            thread_id, view, op=op, create=create, keep_tools=keep_tools_message))
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
        out = self._sync_driver().run(self._thread(thread_id).lock, self._flow(
            thread_id, view, op="generate", sampling=_sampling(sampling), message_id=message_id))
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
        out = await self._async_driver().run(self._thread(thread_id).lock, self._flow(
            thread_id, view, op="generate", sampling=_sampling(sampling), message_id=message_id))
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
        driver = self._sync_driver()
        with self._thread(thread_id).lock:
            out = yield from driver.drive(flow, stream=True)
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
        driver = self._async_driver()
        async with held(self._thread(thread_id).lock), \
                contextlib.aclosing(driver.drive(flow, stream=True)) as steps:
            async for event in steps:
                if isinstance(event, Outcome):
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

    # -- the flow (one implementation, driven sync or async: _memory_flow, _memory_drivers) ----

    def _sync_driver(self) -> SyncDriver:
        if self.client is None:
            raise TypeError("this LeylineMemory has only an AsyncLeylineClient: sync calls (generate, sync, "
                            "LangChain's invoke/stream) need LeylineMemory(LeylineClient()); or call the async "
                            "ones (agenerate, LangChain's ainvoke/astream)")
        return SyncDriver(self.client)

    def _async_driver(self) -> AsyncDriver:
        # no async client: the sync one, each call in a worker thread
        client = self.async_client if self.async_client is not None else self.client
        assert client is not None  # __init__ makes a LeylineClient when given neither
        return AsyncDriver(client)

    def _thread(self, thread_id: str) -> ThreadState:
        with self._lock:
            th = self._threads.get(thread_id)
            if th is None:
                th = self._threads[thread_id] = ThreadState(thread_id, self.session_id(thread_id))
            return th

    def _flow(self, thread_id: str, view: Sequence[Message | Mapping[str, Any]], *, op: Op,
              **options: Any) -> Flow:
        flow = SyncFlow(self._thread(thread_id), policy=self.policy, max_attempts=self.max_attempts,
                        on_call=self.on_call)
        return flow.run(view, op=op, **options)


def _sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(params) - GENERATE_OPTIONS
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    return {k: v for k, v in params.items() if v is not None}
