"""``POST /v1/chat/completions`` bound to a session, written once against a small backend protocol.

The request (:mod:`.chat_request`), the checks below, the turn's plan and its rules for
built and rebuilt sessions (:mod:`.chat_turn`), and the response with its ``leyline``
report (:mod:`.chat_response`) are the same on every engine; what a turn does to the
engine's cache is the engine's (:class:`ChatBackend`). Errors leave in OpenAI's shape
(:class:`~leyline_runtime.api.openai_errors.OpenAIRoute`), a 400 naming the field for a
bad request, on both engines.

An engine may be unable to honour a field (vLLM streams no bound reply and constrains no
decoding): it lists it in :attr:`ChatBackend.refused`, and a request that asks for it is
refused with a 400 naming it, never served as if the field were absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from leyline_sdk.protocol import SESSION_HEADER, SessionId

from .chat_request import NEEDS_SWITCH, ChatCompletionRequest, NamedToolChoice
from .chat_response import ChatCompletion, CompletionIds, completion
from .chat_turn import ChatTurn
from .openai_errors import OpenAIError


def _asked(param: str, asks: bool) -> str | None:
    return param if asks else None


def _strict_tool(body: ChatCompletionRequest) -> str | None:
    return next((f"tools[{i}].function.strict" for i, t in enumerate(body.tools or []) if t.function.strict), None)


# What a request may ask that an engine may not do: each answers the request field that asks it (None: the
# request does not; a field at its neutral value asks nothing, so an engine that refuses it still takes that).
OPTIONAL_FEATURES: dict[str, Callable[[ChatCompletionRequest], str | None]] = {
    "stream": lambda b: _asked("stream", b.stream),
    "response_format": lambda b: _asked("response_format", b.response_format is not None
                                        and b.response_format.type != "text"),
    "tool_choice": lambda b: _asked("tool_choice", b.tool_choice == "required"
                                    or isinstance(b.tool_choice, NamedToolChoice)),
    "parallel_tool_calls": lambda b: _asked("parallel_tool_calls", not b.parallel_tool_calls),
    "strict": _strict_tool,
    "frequency_penalty": lambda b: _asked("frequency_penalty", b.frequency_penalty != 0),
    "presence_penalty": lambda b: _asked("presence_penalty", b.presence_penalty != 0),
    "logit_bias": lambda b: _asked("logit_bias", bool(b.logit_bias)),
    "context_management": lambda b: _asked("context_management", b.context_management is not None),
    "seed": lambda b: _asked("seed", b.seed is not None),
}


class ChatBackend(Protocol):
    """What an engine does for a session-bound chat turn (``request``: the HTTP request, for its app state)."""

    served_model: str  # the model a request may name
    refused: Mapping[str, str]  # OPTIONAL_FEATURES it cannot honour on a bound turn -> why, in words

    async def bound_turn(self, request: Request, session_id: str, body: ChatCompletionRequest,
                         tenant: str) -> ChatTurn:
        """Under the session's lock: :func:`~.chat_turn.plan_chat_turn` from what the engine holds, then
        the plan run as the engine runs it (drop and build, or edit, append, generate); the turn carries
        the plan."""
        ...


def check_request(body: ChatCompletionRequest, served_model: str, refused: Mapping[str, str]) -> None:
    """What every chat request is checked for before any work: its model, the switches its fields
    need, and what this engine refuses (a 400 naming the field; the model: a 404)."""
    if body.model is not None and body.model != served_model:
        raise OpenAIError(f"The model {body.model!r} does not exist; this server serves {served_model!r}",
                          param="model", code="model_not_found", status=404)
    for field, switch in NEEDS_SWITCH.items():
        if getattr(body, field) is not None and not getattr(body, switch):
            raise OpenAIError(f"{field} needs {switch}: true", param=field, code="invalid_request")
    for feature, why in refused.items():
        param = OPTIONAL_FEATURES[feature](body)
        if param is not None:
            raise OpenAIError(f"`{param}` is not supported for a session-bound chat on this server: {why}",
                              param=param, code="unsupported_parameter")


def bound_session(body_session: str | None, header: str | None) -> str | None:
    """The session a request is bound to: its body's ``session_id``, else the ``X-Leyline-Session``
    header (a 400 naming the header when it is not a session id); None: not bound."""
    if body_session is not None or header is None:
        return body_session
    try:
        return _SESSION_ID.validate_python(header)
    except ValidationError as exc:
        raise RequestValidationError(_located(exc, ("header", SESSION_HEADER))) from exc


def read_json(raw: bytes) -> Any:
    """A body read by hand (a route that looks at it before choosing a handler), its syntax errors raised
    as a typed body's are."""
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error",
                                       "ctx": {"error": str(exc)}}]) from exc


def parse_chat_request(data: Any) -> ChatCompletionRequest:
    """``data`` as a chat request, its errors raised as a typed body's are (the same 400s everywhere)."""
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(_located(exc, ("body",))) from exc


async def bound_chat(backend: ChatBackend, request: Request, session_id: str, body: ChatCompletionRequest,
                     tenant: str) -> ChatCompletion:
    """A session-bound chat request, checked, run by ``backend``, answered."""
    check_request(body, backend.served_model, backend.refused)
    turn = await backend.bound_turn(request, session_id, body, tenant)
    return completion(turn, CompletionIds(backend.served_model))


_SESSION_ID: TypeAdapter[str] = TypeAdapter(SessionId)


def _located(exc: ValidationError, where: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{**err, "loc": (*where, *err["loc"])} for err in exc.errors(include_url=False)]
