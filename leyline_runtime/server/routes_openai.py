"""OpenAI-compatible endpoints: ``/v1/chat/completions`` and ``/v1/models``.

Errors here are in OpenAI's shape with 400 for invalid requests (:mod:`.openai_errors`).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.protocol import MAX_ID_LENGTH, SESSION_ID_PATTERN, SESSION_ID_RULE

from ..runtime import Runtime
from .chat import ChatService
from .completion import CompletionIds, completion
from ..api.errors import SESSION_HEADER
from ..api.json_body import OrjsonRoute
from .openapi import NEEDS_SWITCH
from .openai_errors import OpenAIError, OpenAIRoute, openai_error_responses
from .openai_schema import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList
from .prompt import stop_strings
from .routes_sessions import RuntimeDep, Tenant, check_limits
from .sse import stream_chat
from .streaming import DeltaDecoder


class _Route(OpenAIRoute, OrjsonRoute):
    """Bodies parsed with orjson; every error answered in OpenAI's shape."""


router = APIRouter(prefix="/v1", tags=["openai"], route_class=_Route)

_STREAM_DOC = {"text/event-stream": {"schema": {"type": "string"},
                                     "example": 'data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n'}}


def _bound_session(body: ChatCompletionRequest, header: str | None) -> str | None:
    return body.session_id if body.session_id is not None or not header else header


def _check_dependent_fields(body: ChatCompletionRequest) -> None:
    """OpenAI refuses a field whose switch is off rather than ignore it."""
    for field, switch in NEEDS_SWITCH.items():
        if getattr(body, field) is not None and not getattr(body, switch):
            raise OpenAIError(f"{field} needs {switch}: true", param=field, code="invalid_request")


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
    x_leyline_session: Annotated[str | None, Header(alias=SESSION_HEADER, pattern=SESSION_ID_PATTERN,
                                                    max_length=MAX_ID_LENGTH,
                                                    description=f"Same as `session_id`: {SESSION_ID_RULE}")] = None,
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
