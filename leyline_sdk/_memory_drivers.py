"""The two drivers of a :class:`~._memory_flow.SyncFlow`: :class:`SyncDriver` and :class:`AsyncDriver`.

A flow yields requests (:mod:`._memory_requests`); a driver makes each one with its client and sends
the answer back into the flow, or throws the :class:`~.errors.LeylineError` in (the flow's recovery
decides what an error means). The two are twins, as httpx's and openai-python's clients are: same
loop, one blocking, one awaiting.

With ``stream`` a :class:`~._memory_requests.Generate` is streamed and its text deltas are yielded as
they come; once text went out an error is raised as is (no recovery can take it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from typing import Any

from ._memory_flow import Flow, Outcome
from ._memory_requests import Generate, SessionRequest
from ._streaming import StreamEvent
from .client import AsyncLeylineClient, LeylineClient
from .errors import LeylineError
from .protocol import GenerateResponse

__all__ = ["AsyncDriver", "SyncDriver", "held"]


class SyncDriver:
    """Runs flows with a :class:`LeylineClient`."""

    def __init__(self, client: LeylineClient) -> None:
        self.client = client

    def run(self, lock: threading.Lock, flow: Flow) -> Outcome:
        """The flow's outcome, made while holding the thread's lock."""
        with lock:
            steps = self.drive(flow, stream=False)
            try:
                next(steps)
            except StopIteration as done:
                return done.value
        raise AssertionError("a flow driven without streaming yields no text")

    def drive(self, flow: Flow, *, stream: bool) -> Generator[str, None, Outcome]:
        """Make the flow's requests one by one; yields text deltas (``stream`` only), returns the outcome."""
        answer: Any = None
        error: LeylineError | None = None
        streamed = False
        while True:
            try:
                request = flow.throw(error) if error is not None else flow.send(answer)
            except StopIteration as done:
                return done.value
            try:
                if stream and isinstance(request, Generate):
                    with request.stream(self.client) as events:
                        for event in events:
                            if isinstance(event, GenerateResponse):
                                answer = event
                            else:
                                streamed = True
                                yield event
                else:
                    answer = self.send(request)
                error = None
            except LeylineError as exc:
                if streamed:
                    raise  # text went out: no recovery can take it back
                answer, error = None, exc

    def send(self, request: SessionRequest) -> Any:
        return request.send(self.client)


class AsyncDriver:
    """Runs flows with an :class:`AsyncLeylineClient`, or with a :class:`LeylineClient` in a worker thread
    (a memory given only a sync client still has working async methods)."""

    def __init__(self, client: AsyncLeylineClient | LeylineClient) -> None:
        self.client = client

    async def run(self, lock: threading.Lock, flow: Flow) -> Outcome:
        """The flow's outcome, made while holding the thread's lock."""
        async with held(lock), contextlib.aclosing(self.drive(flow, stream=False)) as steps:
            async for step in steps:
                if isinstance(step, Outcome):
                    return step
        raise AssertionError("the flow ended without an outcome")

    async def drive(self, flow: Flow, *, stream: bool) -> AsyncGenerator[str | Outcome, None]:
        """:meth:`SyncDriver.drive`, async: yields the text deltas, then the flow's outcome
        (an async generator cannot return a value)."""
        answer: Any = None
        error: LeylineError | None = None
        streamed = False
        while True:
            try:
                request = flow.throw(error) if error is not None else flow.send(answer)
            except StopIteration as done:
                yield done.value
                return
            try:
                if stream and isinstance(request, Generate):
                    async for event in self._stream(request):
                        if isinstance(event, GenerateResponse):
                            answer = event
                        else:
                            streamed = True
                            yield event
                else:
                    answer = await self.send(request)
                error = None
            except LeylineError as exc:
                if streamed:
                    raise  # text went out: no recovery can take it back
                answer, error = None, exc

    async def send(self, request: SessionRequest) -> Any:
        if isinstance(self.client, AsyncLeylineClient):
            return await request.asend(self.client)
        return await asyncio.to_thread(request.send, self.client)

    async def _stream(self, request: Generate) -> AsyncIterator[StreamEvent]:
        if isinstance(self.client, AsyncLeylineClient):
            async with request.astream(self.client) as events:
                async for event in events:
                    yield event
            return
        with request.stream(self.client) as sync_events:  # each blocking read in a worker thread

            def step() -> StreamEvent | None:
                return next(sync_events, None)

            while (item := await asyncio.to_thread(step)) is not None:
                yield item


@contextlib.asynccontextmanager
async def held(lock: threading.Lock) -> AsyncIterator[None]:
    """Hold a thread's lock from async code without blocking the event loop.

    A ``threading.Lock``, not an ``asyncio.Lock``: sync calls on the same memory hold it too."""
    while not lock.acquire(blocking=False):
        await asyncio.sleep(0.005)
    try:
        yield
    finally:
        lock.release()
