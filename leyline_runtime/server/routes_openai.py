"""OpenAI-compatible endpoints: ``/v1/chat/completions`` and ``/v1/models``.

Errors here are in OpenAI's shape with 400 for invalid requests (:mod:`.openai_errors`).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.protocol import SESSION_ID_PATTERN, SESSION_ID_RULE

from ..runtime import Runtime
from .chat import ChatService
from .completion import CompletionIds, completion
from ..api.json_body import OrjsonRoute
from .openai_errors import OpenAIError, OpenAIRoute, openai_error_responses
from .openai_schema import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList
from .prompt import stop_strings
from .routes_sessions import RuntimeDep, Tenant, check_limits
from .sse import stream_chat
from .streaming import DeltaDecoder


class _Route(OpenAIRoute, OrjsonRoute):
    """Bodies parsed with orjson; every error answered in OpenAI's shape."""


router = APIRouter(prefix="/v1", tags=["openai"], route_class=_Route)

SESSION_HEADER = "X-Leyline-Session"

_STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"},
                                     "example": 'data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n'}}


def _bound_session(body: ChatCompletionRequest, header: str | None) -> str | None:
    if body.session_id is not None or not header:
        return body.session_id
    if not re.fullmatch(SESSION_ID_PATTERN, header):
        raise OpenAIError(f"{SESSION_HEADER}: a session id is {SESSION_ID_RULE}", param=SESSION_HEADER,
                          code="invalid_request")
    return header


def _check_dependent_fields(body: ChatCompletionRequest) -> None:
    """OpenAI refuses a field whose switch is off rather than ignore it."""
    if body.top_logprobs is not None and not body.logprobs:
        raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_request")
    if body.stream_options is not None and not body.stream:
        raise OpenAIError("stream_options needs stream: true", param="stream_options", code="invalid_request")


def _check_model(body: ChatCompletionRequest, served: str) -> None:
    if body.model is not None and body.model != served:
        raise OpenAIError(f"The model {body.model!r} does not exist; this server serves {served!r}",
                          param="model", code="model_not_found", status=404)


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": _STREAM_DOC, "description": "A completion, or an SSE stream when "
                              "`stream` is true"}, **openai_error_responses(404, 409, 413)},
             summary="OpenAI chat completions; with a session, history edits become directives")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    tenant: Tenant,
    x_leyline_session: Annotated[str | None, Header(alias=SESSION_HEADER)] = None,
) -> ChatCompletion | StreamingResponse:
    service: ChatService = request.app.state.chat
    runtime: Runtime = request.app.state.runtime
    _check_model(body, runtime.config.model_name)
    _check_dependent_fields(body)
    session_id = _bound_session(body, x_leyline_session)
    check_limits(request, body.messages)
    ids = CompletionIds(runtime.config.model_name)
    run = partial(service.complete, body, tenant, session_id)
    if not body.stream:
        return completion(await run_in_threadpool(run), ids)
    decoder = DeltaDecoder(runtime.tokenizer, stop_strings(body))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await stream_chat(lambda on_token: run(on_token=on_token), decoder, ids, include_usage)


@router.get("/models", response_model=ModelList, responses=openai_error_responses(), summary="The served model")
async def list_models(request: Request, runtime: RuntimeDep, tenant: Tenant) -> ModelList:
    card = ModelCard(id=runtime.config.model_name, created=request.app.state.started,
                     max_model_len=runtime.max_positions)
    return ModelList(data=[card])
