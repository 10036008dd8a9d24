"""The bundled runtime's session backend: the shared session routes (leyline_runtime.api.sessions), served here.

Every runtime call runs in a worker thread (it waits there for its session
and for the engine's batched steps), so the event loop stays free while the
engine works. Calls that change a session also hold that session's lock,
shared with the chat service, so a chat turn's steps never interleave with
another request on its session. Request limits are checked first: a refused
request never reaches the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.errors import RequestTooLarge
from leyline_sdk.protocol import (
    AppendRequest,
    AppendResult,
    DirectiveBatch,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    Message,
    SessionCreate,
    SessionInfo,
)

from ..api.errors import LeylineErrorRoute
from ..api.sessions import build_session_router
from ..metrics import ServiceMetrics
from ..runtime import Runtime
from .auth import current_tenant
from .constraints import native_processors
from ..api.json_body import OrjsonRoute
from .limits import check_messages, check_text
from .sse import stream_generate
from .streaming import DeltaDecoder

T = TypeVar("T")


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def metrics_of(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
MetricsDep = Annotated[ServiceMetrics, Depends(metrics_of)]
Tenant = Annotated[str, Depends(current_tenant)]


def check_limits(request: Request, messages: list[Message], where: str = "messages") -> None:
    """The request limits (message size and count, tokens per request) every route checks first."""
    runtime: Runtime = request.app.state.runtime
    check_messages(request.app.state.limits, runtime.tokenizer, runtime.max_request_tokens, messages, where)


class RuntimeSessions:
    """:class:`~leyline_runtime.api.sessions.SessionBackend` over the app's :class:`Runtime`."""

    def __init__(self, request: Request) -> None:
        state = request.app.state
        self.request = request
        self.runtime: Runtime = state.runtime
        self.metrics: ServiceMetrics = state.metrics
        self.limits = state.limits
        self.chat = state.chat

    async def create_session(self, request: Request, body: SessionCreate, tenant: str) -> SessionInfo:
        self._check_limits(body.messages)
        if body.session_id is None:
            return await run_in_threadpool(self.runtime.create_session, body, tenant)
        return await self._on_session(tenant, body.session_id, self.runtime.create_session, body, tenant)

    async def list_sessions(self, request: Request, tenant: str) -> list[SessionInfo]:
        return await run_in_threadpool(self.runtime.list_sessions, tenant)

    async def get_session(self, request: Request, session_id: str, tenant: str,
                          include_messages: bool) -> SessionInfo:
        return await run_in_threadpool(self.runtime.get_session, session_id, tenant, include_messages)

    async def delete_session(self, request: Request, session_id: str, tenant: str) -> None:
        await self._on_session(tenant, session_id, self.runtime.delete_session, session_id, tenant)

    async def append(self, request: Request, session_id: str, body: AppendRequest, tenant: str) -> AppendResult:
        self._check_limits(body.messages)
        return await self._on_session(tenant, session_id, self.runtime.append, session_id, body.messages, tenant,
                                      body.expected_version)

    async def generate(self, request: Request, session_id: str, body: GenerateRequest,
                       tenant: str) -> GenerateResponse | StreamingResponse:
        self._check_limits(body.messages)
        runtime, metrics = self.runtime, self.metrics
        processors = native_processors(body, runtime.tokenizer, self.chat.grammars)

        def run(on_token: Callable[[int], None] | None = None) -> GenerateResponse:  # in a worker thread
            with self.chat.session_locks.hold((tenant, session_id)):
                result = runtime.generate(session_id, body, tenant, on_token, processors)
            metrics.observe_generation("generate", result.finish_reason, result.usage.completion_tokens, tenant)
            return result

        if body.stream:
            return await stream_generate(run, DeltaDecoder(runtime.tokenizer, body.stop_strings()))
        return await run_in_threadpool(run)

    async def apply(self, request: Request, batch: DirectiveBatch, tenant: str) -> DirectiveResult:
        self._check_directive_limits(batch)
        result = await self._on_session(tenant, batch.session_id, self.runtime.apply, batch, tenant)
        self.metrics.observe_directives(result, tenant)
        return result

    # -- helpers -----------------------------------------------------------------------------

    async def _on_session(self, tenant: str, session_id: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, holding the session's lock."""
        locks = self.chat.session_locks

        def run() -> T:
            with locks.hold((tenant, session_id)):
                return fn(*args)

        return await run_in_threadpool(run)

    def _check_limits(self, messages: list[Message], where: str = "messages") -> None:
        check_limits(self.request, messages, where)

    def _check_directive_limits(self, batch: DirectiveBatch) -> None:
        runtime = self.runtime
        messages = [m for d in batch.directives if isinstance(d.replacement, list) for m in d.replacement
                    if isinstance(m, Message)]
        self._check_limits(messages, "directives.replacement")
        texts = [d.replacement for d in batch.directives if isinstance(d.replacement, str)]
        check_text(self.limits, runtime.tokenizer, runtime.max_request_tokens, texts, "directives.replacement")
        ids = sum(len(d.replacement) for d in batch.directives
                  if isinstance(d.replacement, list) and d.replacement and isinstance(d.replacement[0], int))
        if ids > runtime.max_request_tokens:
            raise RequestTooLarge(f"directives.replacement: {ids} token ids; this server takes at most "
                                  f"{runtime.max_request_tokens} new tokens per request (--max-request-tokens)")


class _Route(LeylineErrorRoute, OrjsonRoute):
    """Errors mapped as everywhere; bodies parsed with orjson."""


router = build_session_router(RuntimeSessions, current_tenant, route_class=_Route)
