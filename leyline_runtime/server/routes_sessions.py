"""Leyline-native endpoints: sessions, appends, generation, directive batches.

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

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.errors import RequestTooLarge
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
    Message,
    SessionCreate,
    SessionInfo,
    SessionList,
)

from ..metrics import ServiceMetrics
from ..runtime import Runtime
from .auth import current_tenant
from .constraints import native_processors
from .errors import error_responses
from .json_body import OrjsonRoute
from .limits import check_messages, check_text
from .sse import stream_generate
from .streaming import DeltaDecoder

T = TypeVar("T")
router = APIRouter(tags=["sessions"], route_class=OrjsonRoute)


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def metrics_of(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
MetricsDep = Annotated[ServiceMetrics, Depends(metrics_of)]
Tenant = Annotated[str, Depends(current_tenant)]
SessionId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=SESSION_ID_PATTERN,
                                 description=f"The session's id: {SESSION_ID_RULE}")]
BODY_ERRORS = (400, 408, 413)


def check_limits(request: Request, messages: list[Message], where: str = "messages") -> None:
    runtime: Runtime = request.app.state.runtime
    check_messages(request.app.state.limits, runtime.tokenizer, runtime.max_request_tokens, messages, where)


async def on_session(request: Request, tenant: str, session_id: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread, holding the session's lock."""
    locks = request.app.state.chat.session_locks

    def run() -> T:
        with locks.hold((tenant, session_id)):
            return fn(*args)

    return await run_in_threadpool(run)


@router.post("/sessions", status_code=201, response_model=SessionInfo, responses=error_responses(*BODY_ERRORS),
             summary="Create a session (optionally with messages, prefilled now)")
async def create_session(body: SessionCreate, request: Request, runtime: RuntimeDep, tenant: Tenant) -> SessionInfo:
    check_limits(request, body.messages)
    if body.session_id is None:
        return await run_in_threadpool(runtime.create_session, body, tenant)
    return await on_session(request, tenant, body.session_id, runtime.create_session, body, tenant)


@router.get("/sessions", response_model=SessionList, responses=error_responses(),
            summary="List this tenant's sessions")
async def list_sessions(runtime: RuntimeDep, tenant: Tenant) -> SessionList:
    return SessionList(sessions=await run_in_threadpool(runtime.list_sessions, tenant))


@router.get("/sessions/{session_id}", response_model=SessionInfo, responses=error_responses(404),
            summary="Inspect a session: version, tokens, segment table, counters")
async def get_session(
    session_id: SessionId, runtime: RuntimeDep, tenant: Tenant,
    include_messages: Annotated[bool, Query(description="Add the session's messages")] = False,
) -> SessionInfo:
    return await run_in_threadpool(runtime.get_session, session_id, tenant, include_messages)


@router.delete("/sessions/{session_id}", status_code=204, response_class=Response,
               responses=error_responses(404), summary="Drop a session and free its cache blocks")
async def delete_session(session_id: SessionId, request: Request, runtime: RuntimeDep, tenant: Tenant) -> Response:
    await on_session(request, tenant, session_id, runtime.delete_session, session_id, tenant)
    return Response(status_code=204)


@router.post("/sessions/{session_id}/messages", response_model=AppendResult,
             responses=error_responses(404, 409, *BODY_ERRORS), summary="Append messages (prefills only them)")
async def append_messages(body: AppendRequest, session_id: SessionId, request: Request,
                          runtime: RuntimeDep, tenant: Tenant) -> AppendResult:
    check_limits(request, body.messages)
    return await on_session(request, tenant, session_id, runtime.append, session_id, body.messages, tenant,
                            body.expected_version)


_STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"}, "example": (
    'data: {"type": "delta", "content": "Hel"}\n\ndata: {"type": "delta", "content": "lo"}\n\n'
    'data: {"type": "done", "response": {"session_id": "s1", "message": {...}, ...}}\n\n')}}


@router.post("/sessions/{session_id}/generate", response_model=GenerateResponse,
             responses={200: {"content": _STREAM_DOC, "description": "The generated message, or with `stream` "
                              "an SSE stream: `delta` events with text, then one `done` event with the "
                              "GenerateResponse (or an `error` event)"},
                        **error_responses(404, 409, *BODY_ERRORS)},
             summary="Optionally append messages, then generate an assistant message (appended too)")
async def generate(body: GenerateRequest, session_id: SessionId, request: Request, runtime: RuntimeDep,
                   metrics: MetricsDep, tenant: Tenant) -> GenerateResponse | StreamingResponse:
    check_limits(request, body.messages)
    processors = native_processors(body, runtime.tokenizer, request.app.state.chat.grammars)
    locks = request.app.state.chat.session_locks

    def run(on_token: Callable[[int], None] | None = None) -> GenerateResponse:  # in a worker thread
        with locks.hold((tenant, session_id)):
            result = runtime.generate(session_id, body, tenant, on_token, processors)
        metrics.observe_generation("generate", result.finish_reason, result.usage.completion_tokens, tenant)
        return result

    if body.stream:
        return await stream_generate(run, DeltaDecoder(runtime.tokenizer, body.stop_strings()))
    return await run_in_threadpool(run)


@router.post("/directives", response_model=DirectiveResult, tags=["directives"],
             responses=error_responses(404, 409, *BODY_ERRORS),
             summary="Apply one atomic batch of directives to a session")
async def apply_directives(body: DirectiveBatch, request: Request, runtime: RuntimeDep, metrics: MetricsDep,
                           tenant: Tenant) -> DirectiveResult:
    check_directive_limits(request, body)
    result = await on_session(request, tenant, body.session_id, runtime.apply, body, tenant)
    metrics.observe_directives(result, tenant)
    return result


def check_directive_limits(request: Request, batch: DirectiveBatch) -> None:
    runtime: Runtime = request.app.state.runtime
    messages = [m for d in batch.directives if isinstance(d.replacement, list) for m in d.replacement
                if isinstance(m, Message)]
    check_limits(request, messages, "directives.replacement")
    texts = [d.replacement for d in batch.directives if isinstance(d.replacement, str)]
    check_text(request.app.state.limits, runtime.tokenizer, runtime.max_request_tokens, texts,
               "directives.replacement")
    ids = sum(len(d.replacement) for d in batch.directives
              if isinstance(d.replacement, list) and d.replacement and isinstance(d.replacement[0], int))
    if ids > runtime.max_request_tokens:
        raise RequestTooLarge(f"directives.replacement: {ids} token ids; this server takes at most "
                              f"{runtime.max_request_tokens} new tokens per request (--max-request-tokens)")
