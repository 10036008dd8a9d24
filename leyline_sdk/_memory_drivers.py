"""Drivers of a :class:`~._memory_flow.SyncFlow`: they make its calls with the sync or the async client.

With ``stream`` the generate is streamed and its text deltas are yielded as they come; once text
went out an error is raised as is (no recovery can take it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from typing import Any

from ._memory_flow import Flow, Outcome, Req
from ._streaming import StreamEvent
from .client import AsyncLeylineClient, LeylineClient
from .errors import LeylineError
from .protocol import GenerateResponse


class Driver:
    """The memory's clients, and the two ways of running a flow with them."""

    def __init__(self, client: LeylineClient | None, async_client: AsyncLeylineClient | None) -> None:
        self.client = client
        self.async_client = async_client

    def sync_client(self) -> LeylineClient:
        if self.client is None:
            raise TypeError("this LeylineMemory has only an async client; use the async methods "
                            "(ainvoke/astream) or give it a LeylineClient")
        return self.client

    def run(self, lock: threading.Lock, flow: Flow) -> Outcome:
        with lock:
            steps = self.drive(flow, stream=False)
            while True:
                try:
                    next(steps)
                except StopIteration as stop:
                    return stop.value

    def drive(self, flow: Flow, stream: bool) -> Generator[str, None, Outcome]:
        client = self.sync_client()
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

    @staticmethod
    @contextlib.asynccontextmanager
    async def locked(lock: threading.Lock) -> AsyncIterator[None]:
        while not lock.acquire(blocking=False):  # a threading lock: sync callers hold it too
            await asyncio.sleep(0.005)
        try:
            yield
        finally:
            lock.release()

    async def arun(self, lock: threading.Lock, flow: Flow) -> Outcome:
        async with self.locked(lock), contextlib.aclosing(self.adrive(flow, stream=False)) as steps:
            async for event in steps:
                if isinstance(event, Outcome):
                    return event
        raise AssertionError("the flow ended without an outcome")

    async def adrive(self, flow: Flow, stream: bool) -> AsyncGenerator[str | Outcome, None]:
        """:meth:`drive`, async: yields the deltas, then the flow's outcome."""
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
                    value = await self.call_async(req)
                error = None
            except LeylineError as exc:
                if streamed:
                    raise
                value, error = None, exc

    async def _agenerate_stream(self, req: Req) -> AsyncIterator[StreamEvent]:
        if self.async_client is not None:
            async for event in self.async_client.generate_stream(*req.args, **req.kwargs):
                yield event
            return
        # only a sync client: stream it from a worker thread
        events = self.sync_client().generate_stream(*req.args, **req.kwargs)

        def step() -> StreamEvent | None:
            return next(events, None)

        while (item := await asyncio.to_thread(step)) is not None:
            yield item

    async def call_async(self, req: Req) -> Any:
        if self.async_client is not None:
            return await getattr(self.async_client, req.method)(*req.args, **req.kwargs)
        method = getattr(self.sync_client(), req.method)
        return await asyncio.to_thread(method, *req.args, **req.kwargs)
