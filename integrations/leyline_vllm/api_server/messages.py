"""Anthropic's Messages API on ``vllm serve``: ``/v1/messages`` and ``/v1/messages/count_tokens``.

A Messages request is the bundled runtime's (:mod:`leyline_runtime.api.messages_request`: translated
into the chat request) run as the plugin's bound chat turn (:class:`~.endpoints.VllmChat`: the same
session binding, directives and ``context_management``), answered in Anthropic's shape
(:mod:`leyline_runtime.api.messages_response`) with Anthropic's errors
(:mod:`leyline_runtime.api.messages_errors`). With ``X-Leyline-Session`` it runs on that session.
Without it (Anthropic's clients send none) it runs on the held session whose history it continues, or
on a new one: the bundled runtime's rule (:mod:`leyline_runtime.api.continuation`), scoped by the key
the request authenticated with (``vllm serve`` has no other tenant), ``metadata.user_id`` and
``x-claude-code-session-id``. An unbound request the bound turn cannot serve (a feature the plugin
refuses, e.g. ``tool_choice`` ``any``; a block it does not translate) goes to vLLM's own handler
unchanged: a client that asked for no session never gets a refusal vLLM itself would not give.
``count_tokens`` without the header is vLLM's own. The key arrives as ``x-api-key`` or Bearer
(:class:`~.auth.AnthropicKeys`); ``anthropic-version`` and ``anthropic-beta`` change nothing.

With ``stream: true`` a reply comes as Anthropic's SSE events (``message_start``, ``ping``,
``content_block_*``, ``message_delta``, ``message_stop``), all sent once the reply is whole: the
plugin generates a session's reply in one pass and does not stream its tokens (as its chat route).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from leyline_runtime.api.chat import bound_session, check_request, read_json
from leyline_runtime.api.chat_prompt import prompt_messages, stop_strings
from leyline_runtime.api.chat_request import ChatCompletionRequest
from leyline_runtime.api.continuation import Scope
from leyline_runtime.api.messages_errors import AnthropicRoute, anthropic_error_responses
from leyline_runtime.api.messages_request import MessagesPrompt, MessagesRequest, chat_request
from leyline_runtime.api.messages_response import (
    MessageReply,
    MessagesStreamShape,
    MessagesTurn,
    TokenCount,
    message_id,
    message_reply,
    reply_sent_back,
    token_count,
)
from leyline_runtime.api.openai_errors import OpenAIError
from leyline_sdk.errors import LeylineError
from leyline_sdk.protocol import SESSION_HEADER, Message

from .service import VllmTurn

Backend = Callable[[Request], Any]  # the request's VllmChat (endpoints.py; passed in: it imports this module)

_BOUND = (f"With `{SESSION_HEADER}`, Leyline's turn on the session (history edits become directives, "
          "`context_management` honoured). Without it, on the held session whose history (as the client sends it, "
          "and the reply it got) the request's messages start with, among this API key's sessions, and "
          "`metadata.user_id`'s and `x-claude-code-session-id`'s when given; none: a new session. An unbound "
          "request this turn cannot serve (a refused feature, e.g. `tool_choice` `any`) is vLLM's own handler's, "
          "as is `count_tokens` without the header")
CLIENT_SESSION_HEADER = "x-claude-code-session-id"  # Claude Code's own session: narrows the scope
ONE_TENANT = "default"  # vllm serve's sessions have no tenants


def build_messages_router(chat: Backend, original: dict[str, APIRoute]) -> APIRouter:
    """The two routes; ``original``: vLLM's own routes by path, for requests without a session."""
    router = APIRouter(tags=["anthropic"], route_class=AnthropicRoute)

    @router.post("/v1/messages", response_model=None, summary="Anthropic Messages; on a session, edits "
                 "become directives", description=_BOUND, responses={
                     200: {"model": MessageReply, "description": "A message, or Anthropic's SSE events when "
                           "`stream` is true (sent once the reply is whole)"}, **anthropic_error_responses()})
    async def create_message(request: Request):
        data = read_json(await request.body())
        session_id = bound_session(None, request.headers.get(SESSION_HEADER))  # a bad header: a 400
        if session_id is not None:
            backend = chat(request)
            body, chat_body = _checked(backend, data)
            answered = await _turn(backend, request, session_id, chat_body)
            return _answer(body, answered, backend.served_model)
        served = _servable(chat, request, data)
        if served is None:
            return await _delegate(original.get("/v1/messages"), request, data, "AnthropicMessagesRequest")
        backend, body, chat_body = served
        user = body.metadata.user_id if body.metadata else None
        scope = Scope(_tenant(request), user, request.headers.get(CLIENT_SESSION_HEADER))
        # the session found is out of the index while its turn runs; the reply (as the client sends it
        # back) is the next request's key, and a turn that fails puts the old key back
        with request.app.state.leyline_continuations.continuing(scope, prompt_messages(chat_body)) as bound:
            answered = await _turn(backend, request, bound.session_id, chat_body)
            bound.reply = reply_sent_back(answered.turn)
        return _answer(body, answered, backend.served_model)

    @router.post("/v1/messages/count_tokens", response_model=None, description=_BOUND,
                 summary="The prompt's tokens for a Messages request, as the model would see them",
                 responses={200: {"model": TokenCount, "description": "The count"}, **anthropic_error_responses()})
    async def count_tokens(request: Request):
        data = read_json(await request.body())
        if request.headers.get(SESSION_HEADER) is None:
            return await _delegate(original.get("/v1/messages/count_tokens"), request, data,
                                   "AnthropicCountTokensRequest")
        bound_session(None, request.headers.get(SESSION_HEADER))  # a bad header is a 400 here too
        body = _parse(MessagesPrompt, data)
        backend = chat(request)
        chat_body = chat_request(body)
        check_request(chat_body, backend.served_model, {})
        renderer = backend.service.renderer

        def tokens(messages: list[Message]) -> int:  # the prompt vLLM would run: with the reply's header
            return len(renderer.ids(messages, generation_prompt=True))

        return token_count(chat_body, renderer, tokens, body.context_management is not None)

    return router


def _checked(backend: Any, data: Any) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """The request parsed, translated and checked as the bound turn runs it (a 4xx naming what is wrong)."""
    body = _parse(MessagesRequest, data)
    try:
        chat_body = chat_request(body)
    except ValidationError as exc:  # a translated field out of the chat request's bounds: the client's 400
        raise _request_error(exc) from exc
    # the chat route's refusals, but a stream: here it is the whole reply's events
    check_request(chat_body, backend.served_model, {k: v for k, v in backend.refused.items() if k != "stream"})
    return body, chat_body


def _servable(chat: Backend, request: Request, data: Any) -> tuple[Any, MessagesRequest, ChatCompletionRequest] | None:
    """An unbound request as the bound turn would run it; None: the plugin cannot serve it (no engine, a
    refused feature, anything its translation refuses), so vLLM's own handler answers it as without the plugin."""
    if getattr(request.app.state, "leyline", None) is None:  # a render-only server
        return None
    backend = chat(request)
    try:
        return (backend, *_checked(backend, data))
    except (RequestValidationError, OpenAIError):
        return None


def _tenant(request: Request) -> str:
    """Whose sessions an unbound request may continue: the key it passed vLLM's check with (x-api-key arrives
    here as Bearer, :class:`~.auth.AnthropicKeys`), so one key never continues another's; hashed, as the
    bundled runtime names a key's tenant. A server without keys is one tenant."""
    if not getattr(request.app.state, "leyline_api_keys", []):
        return ONE_TENANT
    key = request.headers.get("authorization", "").partition(" ")[2]
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:16]


async def _turn(backend: Any, request: Request, session_id: str, chat_body: ChatCompletionRequest) -> MessagesTurn:
    turn: VllmTurn = await backend.bound_turn(request, session_id, chat_body, ONE_TENANT)
    stop = turn.stop_string if turn.stop_string in stop_strings(chat_body) else None
    return MessagesTurn(_object_inputs(turn), stop)


def _answer(body: MessagesRequest, answered: MessagesTurn, model: str):
    msg_id = message_id()
    if not body.stream:
        return message_reply(answered, msg_id, model)
    shape = MessagesStreamShape(msg_id, model)
    events = [*shape.opening(), *shape.closing(answered, answered.turn.response.message.content)]
    return StreamingResponse(_frames(events), media_type="text/event-stream")


def _parse(model: type[BaseModel], data: Any) -> Any:
    """``data`` as ``model``, its errors raised as a typed body's are (the same 400s as the bundled route)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _request_error(exc) from exc


def _request_error(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)])


def _object_inputs(turn: VllmTurn) -> VllmTurn:
    """The turn with each tool call's arguments a JSON object, as a ``tool_use`` block's ``input`` must be:
    nothing constrains them on vLLM, so a call whose arguments are not one has them under ``arguments``
    (the session keeps the call as generated; the client's copy then differs, and is one more edit)."""
    message = turn.response.message
    calls = []
    for call in message.tool_calls or []:
        try:
            value = json.loads(call.function.arguments or "{}")
        except ValueError:
            value = call.function.arguments
        if not isinstance(value, dict):
            call = call.model_copy(update={"function": call.function.model_copy(
                update={"arguments": json.dumps({"arguments": value}, ensure_ascii=False)})})
        calls.append(call)
    if calls == list(message.tool_calls or []):
        return turn
    response = turn.response.model_copy(update={"message": message.model_copy(update={"tool_calls": calls})})
    return replace(turn, response=response)


def _frames(events: list[dict[str, Any]]) -> Iterator[str]:
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _delegate(original: APIRoute | None, request: Request, data: Any, model: str):
    """A Messages request without a session: vLLM's own handler, as if no plugin were loaded."""
    if original is None:
        raise LeylineError("vLLM's Messages endpoint is not available", code="unavailable", status_code=503)
    from vllm.entrypoints.anthropic import protocol

    return await original.endpoint(request=_parse(getattr(protocol, model), data), raw_request=request)
