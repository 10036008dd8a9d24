"""Leyline-native endpoints: sessions, appends, generation, directive batches.

Every runtime call runs in a worker thread (the runtime serialises them with
its own lock), so the event loop stays free while the engine works.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from leyline_sdk.protocol import (
    MAX_ID_LENGTH,
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

from ..metrics import ServiceMetrics
from ..runtime import Runtime
from .auth import current_tenant
from .constraints import native_processors
from .errors import error_responses

router = APIRouter(tags=["sessions"])


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def metrics_of(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]
MetricsDep = Annotated[ServiceMetrics, Depends(metrics_of)]
Tenant = Annotated[str, Depends(current_tenant)]
SessionId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="The session's id")]


@router.post("/sessions", status_code=201, response_model=SessionInfo, responses=error_responses(413),
             summary="Create a session (optionally with messages, prefilled now)")
async def create_session(body: SessionCreate, runtime: RuntimeDep, tenant: Tenant) -> SessionInfo:
    return await run_in_threadpool(runtime.create_session, body, tenant)


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
async def delete_session(session_id: SessionId, runtime: RuntimeDep, tenant: Tenant) -> Response:
    await run_in_threadpool(runtime.delete_session, session_id, tenant)
    return Response(status_code=204)


@router.post("/sessions/{session_id}/messages", response_model=AppendResult,
             responses=error_responses(404, 409, 413), summary="Append messages (prefills only them)")
async def append_messages(body: AppendRequest, session_id: SessionId,
                          runtime: RuntimeDep, tenant: Tenant) -> AppendResult:
    return await run_in_threadpool(runtime.append, session_id, body.messages, tenant, body.expected_version)


@router.post("/sessions/{session_id}/generate", response_model=GenerateResponse,
             responses=error_responses(404, 409, 413),
             summary="Optionally append messages, then generate an assistant message (appended too)")
async def generate(body: GenerateRequest, session_id: SessionId, runtime: RuntimeDep, metrics: MetricsDep,
                   tenant: Tenant, request: Request) -> GenerateResponse:
    processors = native_processors(body, runtime.tokenizer, request.app.state.chat.grammars)
    result = await run_in_threadpool(runtime.generate, session_id, body, tenant, None, processors)
    metrics.observe_generation("generate", result.finish_reason, result.usage.completion_tokens)
    return result


@router.post("/directives", response_model=DirectiveResult, tags=["directives"],
             responses=error_responses(404, 409, 413),
             summary="Apply one atomic batch of directives to a session")
async def apply_directives(body: DirectiveBatch, runtime: RuntimeDep, metrics: MetricsDep,
                           tenant: Tenant) -> DirectiveResult:
    result = await run_in_threadpool(runtime.apply, body, tenant)
    metrics.observe_directives(result)
    return result
