"""One retry policy for both clients: what is retried, how long to wait, what is raised.

Only failures that happen before the request reached the server are retried
(refused connection, connect or pool timeout): retrying them cannot apply a
directive or append a message twice. An HTTP status, or a failure after
sending, is never retried.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import ClassVar

import httpx

from ._config import BASE_URL_ENV, DEFAULT_BASE_URL
from .errors import APIConnectionError, APITimeoutError

_NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` further tries after the first, with capped exponential backoff and jitter."""

    max_retries: int
    base_url: str  # named in the error raised when the tries run out

    initial_delay: ClassVar[float] = 0.25
    max_delay: ClassVar[float] = 4.0

    def send(self, http: httpx.Client, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            try:
                return http.send(request, stream=stream)
            except httpx.TransportError as exc:
                time.sleep(self.delay_or_raise(exc, attempt))
                attempt += 1

    async def asend(
        self, http: httpx.AsyncClient, request: httpx.Request, *, stream: bool = False
    ) -> httpx.Response:
        """:meth:`send`, async (the same decisions, an ``await`` where it sleeps)."""
        attempt = 0
        while True:
            try:
                return await http.send(request, stream=stream)
            except httpx.TransportError as exc:
                await asyncio.sleep(self.delay_or_raise(exc, attempt))
                attempt += 1

    def delay_or_raise(self, exc: httpx.TransportError, attempt: int) -> float:
        """Seconds to wait before try ``attempt + 1``, or raise the mapped error."""
        if attempt >= self.max_retries or not isinstance(exc, _NOT_SENT_ERRORS):
            raise transport_error(exc, self.base_url) from exc
        base = min(self.initial_delay * 2.0**attempt, self.max_delay)
        return base * (0.75 + 0.25 * random.random())  # jitter: clients that failed together retry apart


def transport_error(exc: httpx.TransportError, base_url: str) -> APIConnectionError:
    """The error for a request that got no HTTP response; it names the URL and where it came from."""
    message = str(exc) or type(exc).__name__
    try:
        target = f"{exc.request.method} {exc.request.url}"
    except RuntimeError:  # an exception raised without its request
        target = base_url
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out: {target}: {message}", status_code=None)
    return APIConnectionError(
        f"cannot reach the Leyline runtime at {base_url} ({target}: {message}). Is it running "
        f"(`leyline-runtime serve`)? The URL comes from base_url=, else the {BASE_URL_ENV} "
        f"environment variable, else {DEFAULT_BASE_URL}.",
        status_code=None,
    )
