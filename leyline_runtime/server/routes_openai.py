"""OpenAI-compatible endpoints: ``/v1/chat/completions`` and ``/v1/models``.

A session-bound chat that does not stream is every engine's (:func:`leyline_runtime.api.chat.bound_chat`,
served here by :class:`RuntimeChat`); stateless chats and streamed replies are this runtime's own,
checked the same way. Errors here are in OpenAI's shape with 400 for invalid requests
(:mod:`leyline_runtime.api.openai_errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.protocol import MAX_ID_LENGTH, SESSION_ID_PATTERN, SESSION_ID_RULE

from ..api.chat import bound_chat, bound_session, check_request
from ..api.chat_prompt import stop_strings
from ..api.chat_request import ChatCompletionRequest
from ..api.chat_response import ChatCompletion, CompletionIds, completion
from ..api.chat_turn import ChatTurn
from ..api.errors import SESSION_HEADER
from ..api.json_body import OrjsonRoute
from ..api.openai_errors import OpenAIRoute, openai_error_responses
from ..api.sse_schema import sse_content
from ..runtime import Runtime
from .chat import ChatService
from .openai_schema import ModelCard, ModelList
from .routes_sessions import RuntimeDep, Tenant, check_limits
from .sse import stream_chat
from .streaming import DeltaDecoder


class _Route(OpenAIRoute, OrjsonRoute):
    """Bodies parsed with orjson; every error answered in OpenAI's shape."""


router = APIRouter(prefix="/v1", tags=["openai"], route_class=_Route)

_STREAM_DOC = sse_content('data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n')


class RuntimeChat:
    """:class:`~leyline_runtime.api.chat.ChatBackend` over the app's :class:`ChatService`: the turn runs in
    a worker thread, holding the session's lock."""

    refused: Mapping[str, str] = {}  # this runtime honours every field

    def __init__(self, request: Request) -> None:
        self.service: ChatService = request.app.state.chat
        runtime: Runtime = request.app.state.runtime
        self.served_model = runtime.config.model_name

    async def bound_turn(self, request: Request, session_id: str, body: ChatCompletionRequest,
                         tenant: str) -> ChatTurn:
        return await run_in_threadpool(self.service.complete, body, tenant, session_id)


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
    chat = RuntimeChat(request)
    session_id = bound_session(body.session_id, x_leyline_session)
    check_limits(request, body.messages)
    if session_id is not None and not body.stream:
        return await bound_chat(chat, request, session_id, body, tenant)
    check_request(body, chat.served_model, chat.refused)
    ids = CompletionIds(chat.served_model)
    run = partial(chat.service.complete, body, tenant, session_id)
    if not body.stream:
        return completion(await run_in_threadpool(run), ids)
    decoder = DeltaDecoder(request.app.state.runtime.tokenizer, stop_strings(body))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await stream_chat(lambda on_token: run(on_token=on_token), decoder, ids, include_usage)


@router.get("/models", response_model=ModelList, responses=openai_error_responses(), summary="The served model")
async def list_models(request: Request, runtime: RuntimeDep, tenant: Tenant) -> ModelList:
    card = ModelCard(id=runtime.config.model_name, created=request.app.state.started,
                     max_model_len=runtime.max_positions)
    return ModelList(data=[card])
