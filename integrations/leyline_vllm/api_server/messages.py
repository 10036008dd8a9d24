"""Anthropic's Messages API on ``vllm serve``: ``/v1/messages`` and ``/v1/messages/count_tokens``.

A request bound to a session (``X-Leyline-Session``) is the bundled runtime's Messages request
(:mod:`leyline_runtime.api.messages_request`: translated into the chat request) run as the plugin's
bound chat turn (:class:`~.endpoints.VllmChat`: the same session binding, directives and
``context_management``), answered in Anthropic's shape (:mod:`leyline_runtime.api.messages_response`)
with Anthropic's errors (:mod:`leyline_runtime.api.messages_errors`). A request without a session goes
to vLLM's own handler for the path, unchanged. The key arrives as ``x-api-key`` or Bearer
(:class:`~.auth.AnthropicKeys`); ``anthropic-version`` and ``anthropic-beta`` change nothing.

With ``stream: true`` a bound reply comes as Anthropic's SSE events (``message_start``, ``ping``,
``content_block_*``, ``message_delta``, ``message_stop``), all sent once the reply is whole: the
plugin generates a bound reply in one pass and does not stream its tokens (as its chat route).
"""

from __future__ import annotations

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
from leyline_runtime.api.context_edits import apply_edits
from leyline_runtime.api.messages_errors import AnthropicRoute, anthropic_error_responses
from leyline_runtime.api.messages_request import MessagesPrompt, MessagesRequest, chat_request
from leyline_runtime.api.messages_response import (
    MessageReply,
    MessagesStreamShape,
    MessagesTurn,
    TokenCount,
    message_id,
    message_reply,
)
from leyline_sdk.errors import LeylineError
from leyline_sdk.protocol import SESSION_HEADER, Message

from .service import VllmTurn

Backend = Callable[[Request], Any]  # the request's VllmChat (endpoints.py; passed in: it imports this module)

_BOUND = (f"With `{SESSION_HEADER}`, Leyline's turn on the session (history edits become directives, "
          "`context_management` honoured); without it, vLLM's own handler")


def build_messages_router(chat: Backend, original: dict[str, APIRoute]) -> APIRouter:
    """The two routes; ``original``: vLLM's own routes by path, for requests without a session."""
    router = APIRouter(tags=["anthropic"], route_class=AnthropicRoute)

    @router.post("/v1/messages", response_model=None, summary="Anthropic Messages; bound to a session, edits "
                 "become directives", description=_BOUND, responses={
                     200: {"model": MessageReply, "description": "A message, or Anthropic's SSE events when "
                           "`stream` is true (sent once the reply is whole)"}, **anthropic_error_responses()})
    async def create_message(request: Request):
        data = read_json(await request.body())
        header = request.headers.get(SESSION_HEADER)
        if header is None:
            return await _delegate(original.get("/v1/messages"), request, data, "AnthropicMessagesRequest")
        session_id = bound_session(None, header)
        body = _parse(MessagesRequest, data)
        backend = chat(request)
        chat_body = chat_request(body)
        # the chat route's refusals, but a stream: here it is the whole reply's events
        check_request(chat_body, backend.served_model, {k: v for k, v in backend.refused.items() if k != "stream"})
        turn: VllmTurn = await backend.bound_turn(request, session_id, chat_body, "default")
        stop = turn.stop_string if turn.stop_string in stop_strings(chat_body) else None
        answered = MessagesTurn(_object_inputs(turn), stop)
        msg_id = message_id()
        if not body.stream:
            return message_reply(answered, msg_id, backend.served_model)
        shape = MessagesStreamShape(msg_id, backend.served_model)
        events = [*shape.opening(), *shape.closing(answered, turn.response.message.content)]
        return StreamingResponse(_frames(events), media_type="text/event-stream")

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
        original_messages = prompt_messages(chat_body)
        edited, _ = apply_edits(chat_body.context_management, original_messages, renderer)

        def tokens(messages: list[Message]) -> int:  # the prompt vLLM would run: with the reply's header
            return len(renderer.ids(messages, generation_prompt=True))

        count = tokens(edited)
        if body.context_management is None:
            return TokenCount(input_tokens=count)
        return TokenCount(input_tokens=count, context_management={"original_input_tokens": tokens(original_messages)})

    return router


def _parse(model: type[BaseModel], data: Any) -> Any:
    """``data`` as ``model``, its errors raised as a typed body's are (the same 400s as the bundled route)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]) \
            from exc


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
