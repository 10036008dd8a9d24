"""Streamed generations: :class:`Stream` and :class:`AsyncStream`, read from server-sent events.

A streaming generate answers ``text/event-stream``: ``delta`` events carrying
text, then one ``done`` event carrying the :class:`GenerateResponse`, or an
``error`` event (raised as its exception). An answer that is not an event
stream (an error status, a server that does not stream) is read whole.

Both objects send their request when first iterated, so ``generate_stream``
returns at once and an error before the first event raises from the loop,
as it does from ``generate``. Close them (``with``/``async with``, or
``close()``/``aclose()``) to drop the connection before the end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from types import TracebackType
from typing import Self

import httpx
import pydantic

from ._response import model_parser, unexpected_body
from ._retry import transport_error
from .errors import error_for
from .protocol import GenerateResponse

StreamEvent = str | GenerateResponse  # a text delta, or the finished generation (the last event)


class Stream(Iterator[StreamEvent]):
    """The events of one streaming generate: ``str`` deltas, then the :class:`GenerateResponse`."""

    def __init__(self, send: Callable[[], httpx.Response], base_url: str) -> None:
        self._send = send
        self._base_url = base_url
        self.response: httpx.Response | None = None  # set once the request is sent
        self._events = self._read()

    def __next__(self) -> StreamEvent:
        return next(self._events)

    def __iter__(self) -> Self:
        return self

    def close(self) -> None:
        """Stop reading and release the connection (also before the first event)."""
        self._events.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _read(self) -> Generator[StreamEvent, None, None]:
        self.response = response = self._send()
        try:
            if not _is_event_stream(response):
                response.read()
                yield from _whole_generation(response)
                return
            for line in response.iter_lines():
                if (event := decode_event(response, line)) is not None:
                    yield event
        except httpx.TransportError as exc:
            raise transport_error(exc, self._base_url) from exc
        finally:
            response.close()


class AsyncStream(AsyncIterator[StreamEvent]):
    """:class:`Stream`, async: ``async for event in stream``."""

    def __init__(self, send: Callable[[], Awaitable[httpx.Response]], base_url: str) -> None:
        self._send = send
        self._base_url = base_url
        self.response: httpx.Response | None = None
        self._events = self._read()

    async def __anext__(self) -> StreamEvent:
        return await anext(self._events)

    def __aiter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        await self._events.aclose()

    close = aclose  # the client's spelling

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _read(self) -> AsyncGenerator[StreamEvent, None]:
        self.response = response = await self._send()
        try:
            if not _is_event_stream(response):
                await response.aread()
                for whole in _whole_generation(response):
                    yield whole
                return
            async for line in response.aiter_lines():
                if (event := decode_event(response, line)) is not None:
                    yield event
        except httpx.TransportError as exc:
            raise transport_error(exc, self._base_url) from exc
        finally:
            await response.aclose()


def decode_event(response: httpx.Response, line: str) -> StreamEvent | None:
    """One SSE line: a text delta, the final response, or ``None`` (not a data line);
    an ``error`` event raises its exception."""
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[5:].strip())
    except ValueError as exc:
        raise unexpected_body(response, f"stream event {line[:200]!r}", body=line) from exc
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "delta":
        return str(event.get("content", ""))
    if kind == "done":
        try:
            return GenerateResponse.model_validate(event.get("response"))
        except pydantic.ValidationError as exc:
            raise unexpected_body(response, f"stream event not a GenerateResponse: {exc}", body=event) from exc
    error = event.get("error") if isinstance(event, dict) else None
    if kind == "error" and isinstance(error, dict):
        # The status line said 200 before the failure: the error has no status of its own.
        raise error_for(str(error.get("code", "api_error")), str(error.get("message", "")), None,
                        response=response, body=error)
    raise unexpected_body(response, f"stream event {line[:200]!r}", body=event)


def _is_event_stream(response: httpx.Response) -> bool:
    return response.is_success and response.headers.get("content-type", "").startswith("text/event-stream")


def _whole_generation(response: httpx.Response) -> list[StreamEvent]:
    """A non-streamed answer to a streaming generate: its error raised, or its reply as one delta."""
    done = model_parser(GenerateResponse)(response)
    return [done.message.content, done] if done.message.content else [done]
