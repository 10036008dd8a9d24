"""HTTP clients for the Leyline runtime: :class:`LeylineClient` and :class:`AsyncLeylineClient`.

Both have the same methods; the async ones are coroutines. Each endpoint is
described once in :mod:`leyline_sdk._calls`, sent under the one
:class:`~leyline_sdk._retry.RetryPolicy`, and a streamed generation is a
:class:`~leyline_sdk._streaming.Stream` (or :class:`~leyline_sdk._streaming.AsyncStream`),
so the classes only differ in how they send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from . import _calls
from ._calls import Call, DirectiveLike, MessageLike
from ._config import DEFAULT_MAX_RETRIES, ClientConfig
from ._retry import RetryPolicy
from ._streaming import AsyncStream, Stream
from .protocol import (
    AppendResult,
    DirectiveResult,
    GenerateResponse,
    Mode,
    SessionInfo,
)

__all__ = ["AsyncLeylineClient", "LeylineClient"]

T = TypeVar("T")


class _ClientSettings:
    """Read-only views of the resolved settings, shared by both clients."""

    _config: ClientConfig
    _retry: RetryPolicy

    @property
    def base_url(self) -> str:
        return self._config.base_url

    @property
    def api_key(self) -> str | None:
        return self._config.api_key

    @property
    def timeout(self) -> httpx.Timeout:
        return self._config.timeout

    @property
    def max_retries(self) -> int:
        return self._config.max_retries


class LeylineClient(_ClientSettings):
    """Synchronous client.

    ``base_url`` and ``api_key`` default to ``LEYLINE_BASE_URL`` (else
    ``http://127.0.0.1:8000``) and ``LEYLINE_API_KEY``. Connection failures
    that happen before a request is sent are retried ``max_retries`` times;
    HTTP errors never are. Every call about one session carries the
    ``X-Leyline-Session`` header (a session-affinity router routes by it).
    Pass ``transport=`` (e.g. ``httpx.MockTransport``)
    or a ready ``http_client=`` (which this client then does not close).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        if transport is not None and http_client is not None:
            raise TypeError("pass either transport= or http_client=, not both")
        self._config = ClientConfig.resolve(
            base_url,
            api_key,
            timeout,
            max_retries,
            headers,
            client_timeout=http_client.timeout if http_client is not None else None,
        )
        self._retry = RetryPolicy(self._config.max_retries, self._config.base_url)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=self._config.timeout)

    # sessions

    def create_session(
        self, messages: Sequence[MessageLike] | None = None, session_id: str | None = None,
        *, rebuild_reason: str | None = None,
    ) -> SessionInfo:
        """Create a session (named here when ``session_id`` is None, so a router can pin it).
        ``rebuild_reason``: this create rebuilds a session the server lost (sent as
        ``X-Leyline-Rebuild``; the vLLM plugin counts rebuilds by it)."""
        return self._send(_calls.create_session(messages, session_id, rebuild_reason))

    def get_session(self, session_id: str, include_messages: bool = False) -> SessionInfo:
        return self._send(_calls.get_session(session_id, include_messages))

    def list_sessions(self) -> list[SessionInfo]:
        return self._send(_calls.list_sessions())

    def delete_session(self, session_id: str) -> None:
        self._send(_calls.delete_session(session_id))

    def append(
        self, session_id: str, messages: Sequence[MessageLike], expected_version: int | None = None
    ) -> AppendResult:
        return self._send(_calls.append(session_id, messages, expected_version))

    def generate(
        self,
        session_id: str,
        messages: Sequence[MessageLike] | None = None,
        *,
        expected_version: int | None = None,
        **sampling: Any,
    ) -> GenerateResponse:
        """Append ``messages`` (if any), then generate one assistant message."""
        return self._send(_calls.generate(session_id, messages, expected_version, sampling))

    def generate_stream(
        self,
        session_id: str,
        messages: Sequence[MessageLike] | None = None,
        *,
        expected_version: int | None = None,
        **sampling: Any,
    ) -> Stream:
        """:meth:`generate`, streamed: a :class:`Stream` of the text as it is generated (``str``
        deltas that add up to the message's content), then the :class:`GenerateResponse` (tool
        calls, usage, version). The request is sent when the stream is first iterated; an error
        before the first event raises from the loop as :meth:`generate` raises it. Use it in a
        ``with`` block (or ``close()`` it) to drop the connection before the end."""
        call = _calls.generate_stream(session_id, messages, expected_version, sampling)
        request = call.request(self._http, self._config)
        return Stream(lambda: self._retry.send(self._http, request, stream=True), self._config.base_url)

    # directives

    def apply(
        self,
        session_id: str,
        directives: Sequence[DirectiveLike],
        expected_version: int | None = None,
    ) -> DirectiveResult:
        """Apply one atomic batch of directives (addressing the session as it is now)."""
        return self._send(_calls.apply(session_id, directives, expected_version))

    # OpenAI-compatible

    def chat(
        self,
        messages: Sequence[MessageLike],
        session_id: str | None = None,
        mode: Mode | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        model: str | None = None,
        **sampling: Any,
    ) -> dict[str, Any]:
        """``POST /v1/chat/completions``; the parsed OpenAI-shaped response."""
        return self._send(_calls.chat(messages, session_id, mode, tools, model, sampling))

    def health(self) -> dict[str, Any]:
        return self._send(_calls.health())

    # plumbing

    def _send(self, call: Call[T]) -> T:
        return call.parse(self._retry.send(self._http, call.request(self._http, self._config)))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncLeylineClient(_ClientSettings):
    """Asynchronous twin of :class:`LeylineClient`: same arguments, same methods, awaitable."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if transport is not None and http_client is not None:
            raise TypeError("pass either transport= or http_client=, not both")
        self._config = ClientConfig.resolve(
            base_url,
            api_key,
            timeout,
            max_retries,
            headers,
            client_timeout=http_client.timeout if http_client is not None else None,
        )
        self._retry = RetryPolicy(self._config.max_retries, self._config.base_url)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            transport=transport, timeout=self._config.timeout
        )

    # sessions

    async def create_session(
        self, messages: Sequence[MessageLike] | None = None, session_id: str | None = None,
        *, rebuild_reason: str | None = None,
    ) -> SessionInfo:
        return await self._send(_calls.create_session(messages, session_id, rebuild_reason))

    async def get_session(self, session_id: str, include_messages: bool = False) -> SessionInfo:
        return await self._send(_calls.get_session(session_id, include_messages))

    async def list_sessions(self) -> list[SessionInfo]:
        return await self._send(_calls.list_sessions())

    async def delete_session(self, session_id: str) -> None:
        await self._send(_calls.delete_session(session_id))

    async def append(
        self, session_id: str, messages: Sequence[MessageLike], expected_version: int | None = None
    ) -> AppendResult:
        return await self._send(_calls.append(session_id, messages, expected_version))

    async def generate(
        self,
        session_id: str,
        messages: Sequence[MessageLike] | None = None,
        *,
        expected_version: int | None = None,
        **sampling: Any,
    ) -> GenerateResponse:
        """Append ``messages`` (if any), then generate one assistant message."""
        return await self._send(_calls.generate(session_id, messages, expected_version, sampling))

    def generate_stream(
        self,
        session_id: str,
        messages: Sequence[MessageLike] | None = None,
        *,
        expected_version: int | None = None,
        **sampling: Any,
    ) -> AsyncStream:
        """:meth:`LeylineClient.generate_stream`, async."""
        call = _calls.generate_stream(session_id, messages, expected_version, sampling)
        request = call.request(self._http, self._config)
        return AsyncStream(lambda: self._retry.asend(self._http, request, stream=True), self._config.base_url)

    # directives

    async def apply(
        self,
        session_id: str,
        directives: Sequence[DirectiveLike],
        expected_version: int | None = None,
    ) -> DirectiveResult:
        """Apply one atomic batch of directives (addressing the session as it is now)."""
        return await self._send(_calls.apply(session_id, directives, expected_version))

    # OpenAI-compatible

    async def chat(
        self,
        messages: Sequence[MessageLike],
        session_id: str | None = None,
        mode: Mode | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        model: str | None = None,
        **sampling: Any,
    ) -> dict[str, Any]:
        """``POST /v1/chat/completions``; the parsed OpenAI-shaped response."""
        return await self._send(_calls.chat(messages, session_id, mode, tools, model, sampling))

    async def health(self) -> dict[str, Any]:
        return await self._send(_calls.health())

    # plumbing

    async def _send(self, call: Call[T]) -> T:
        return call.parse(await self._retry.asend(self._http, call.request(self._http, self._config)))

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    aclose = close  # httpx spelling

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
