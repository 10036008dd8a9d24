"""The native session routes, declared once against a small backend protocol.

Paths, bodies, path-parameter rules, status codes and the OpenAPI error
entries are the same on every backend; what a route does is the backend's:
the bundled runtime runs its calls in worker threads under the session's
lock, the vLLM plugin awaits its service. Errors leave as Leyline's error body
through :class:`~leyline_runtime.api.errors.LeylineErrorRoute`, whichever app
the router is mounted in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.routing import APIRoute

from leyline_sdk.protocol import (
    MAX_ID_LENGTH,
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    AppendRequest,
    AppendResult,
    DirectiveBatch,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    SessionCreate,
    SessionInfo,
    SessionList,
)

from .errors import LeylineErrorRoute, error_responses
from .sse_schema import sse_content

SessionIdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=SESSION_ID_PATTERN,
                                    description=f"The session's id: {SESSION_ID_RULE}")]
BODY_ERRORS = (400, 408, 413)

_STREAM_DOC = sse_content(
    'data: {"type": "delta", "content": "Hel"}\n\ndata: {"type": "delta", "content": "lo"}\n\n'
    'data: {"type": "done", "response": {"session_id": "s1", "message": {...}, ...}}\n\n')


class SessionBackend(Protocol):
    """What a backend does for each native route (``request``: the HTTP request, for its app state)."""

    async def create_session(self, request: Request, body: SessionCreate, tenant: str) -> SessionInfo: ...

    async def list_sessions(self, request: Request, tenant: str) -> list[SessionInfo]: ...

    async def get_session(self, request: Request, session_id: str, tenant: str,
                          include_messages: bool) -> SessionInfo: ...

    async def delete_session(self, request: Request, session_id: str, tenant: str) -> None: ...

    async def append(self, request: Request, session_id: str, body: AppendRequest, tenant: str) -> AppendResult: ...

    async def generate(self, request: Request, session_id: str, body: GenerateRequest,
                       tenant: str) -> GenerateResponse | Response:
        """The response, or with ``body.stream`` a ``text/event-stream`` of ``delta`` then ``done`` events."""
        ...

    async def apply(self, request: Request, batch: DirectiveBatch, tenant: str) -> DirectiveResult: ...


def build_session_router(backend_of: Callable[[Request], SessionBackend], tenant_of: Callable[..., Any],
                         route_class: type[APIRoute] = LeylineErrorRoute) -> APIRouter:
    """The session routes, served by ``backend_of(request)``; ``tenant_of``: a FastAPI dependency
    answering the caller's tenant. ``route_class`` must derive from ``LeylineErrorRoute``."""
    if not issubclass(route_class, LeylineErrorRoute):
        raise TypeError("the session routes' route class must map errors (derive from LeylineErrorRoute)")
    router = APIRouter(tags=["sessions"], route_class=route_class)
    # plain defaults, not Annotated aliases: these annotations are strings resolved in module globals
    backend_dep, tenant_dep = Depends(backend_of), Depends(tenant_of)

    @router.post("/sessions", status_code=201, response_model=SessionInfo, responses=error_responses(409, *BODY_ERRORS),
                 summary="Create a session (optionally with messages, prefilled now)")
    async def create_session(body: SessionCreate, request: Request, backend: SessionBackend = backend_dep, tenant: str = tenant_dep) -> SessionInfo:
        return await backend.create_session(request, body, tenant)

    @router.get("/sessions", response_model=SessionList, responses=error_responses(),
                summary="List this tenant's sessions")
    async def list_sessions(request: Request, backend: SessionBackend = backend_dep, tenant: str = tenant_dep) -> SessionList:
        return SessionList(sessions=await backend.list_sessions(request, tenant))

    @router.get("/sessions/{session_id}", response_model=SessionInfo, responses=error_responses(404),
                summary="Inspect a session: version, tokens, segment table, counters")
    async def get_session(
        session_id: SessionIdPath, request: Request, backend: SessionBackend = backend_dep, tenant: str = tenant_dep,
        include_messages: Annotated[bool, Query(description="Add the session's messages")] = False,
    ) -> SessionInfo:
        return await backend.get_session(request, session_id, tenant, include_messages)

    @router.delete("/sessions/{session_id}", status_code=204, response_class=Response,
                   responses=error_responses(404), summary="Drop a session and free its cache rows")
    async def delete_session(session_id: SessionIdPath, request: Request, backend: SessionBackend = backend_dep,
                             tenant: str = tenant_dep) -> Response:
        await backend.delete_session(request, session_id, tenant)
        return Response(status_code=204)

    @router.post("/sessions/{session_id}/messages", response_model=AppendResult,
                 responses=error_responses(404, 409, *BODY_ERRORS), summary="Append messages (prefills only them)")
    async def append_messages(body: AppendRequest, session_id: SessionIdPath, request: Request, backend: SessionBackend = backend_dep,
                              tenant: str = tenant_dep) -> AppendResult:
        return await backend.append(request, session_id, body, tenant)

    @router.post("/sessions/{session_id}/generate", response_model=GenerateResponse,
                 responses={200: {"content": _STREAM_DOC, "description": "The generated message, or with `stream` "
                                  "an SSE stream: `delta` events with text, then one `done` event with the "
                                  "GenerateResponse (or an `error` event)"},
                            **error_responses(404, 409, *BODY_ERRORS)},
                 summary="Optionally append messages, then generate an assistant message (appended too)")
    async def generate(body: GenerateRequest, session_id: SessionIdPath, request: Request, backend: SessionBackend = backend_dep,
                       tenant: str = tenant_dep) -> Any:
        return await backend.generate(request, session_id, body, tenant)

    @router.post("/directives", response_model=DirectiveResult, tags=["directives"],
                 responses=error_responses(404, 409, *BODY_ERRORS),
                 summary="Apply one atomic batch of directives to a session")
    async def apply_directives(body: DirectiveBatch, request: Request, backend: SessionBackend = backend_dep,
                               tenant: str = tenant_dep) -> DirectiveResult:
        return await backend.apply(request, body, tenant)

    return router
