"""Every endpoint, described once: a :class:`Call` (method, path, body, how to read the answer).

The builders validate arguments against the protocol's own models before
anything is sent (a bad argument is a :class:`~leyline_sdk.errors.ValidationFailed`
with ``status_code`` ``None``); the two clients only differ in how they send.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import uuid

import httpx
import pydantic

from ._config import ClientConfig
from ._response import json_object, model_parser, no_content
from .errors import ValidationFailed
from .protocol import (
    AppendRequest,
    AppendResult,
    Directive,
    DirectiveBatch,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    Message,
    Mode,
    SessionCreate,
    REBUILD_HEADER,
    SESSION_HEADER,
    SessionInfo,
    SessionList,
)

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)

MessageLike = Message | Mapping[str, Any]
DirectiveLike = Directive | Mapping[str, Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One endpoint call, ready to send; ``parse`` turns the response into the result.

    ``headers``: the call's own; a call about one session carries :data:`SESSION_HEADER`
    (a session-affinity router pins the session's replica by it)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None

    def request(self, http: httpx.Client | httpx.AsyncClient, config: ClientConfig) -> httpx.Request:
        """This call as ``http``'s request, to ``config``'s server with its headers and timeout."""
        return http.build_request(self.method, config.base_url + self.path, json=self.json, params=self.params,
                                  headers=config.request_headers(self.headers), timeout=config.timeout)


def create_session(
    messages: Sequence[MessageLike] | None, session_id: str | None, rebuild_reason: str | None = None
) -> Call[SessionInfo]:
    # Named here, not by the server: behind a router the create must reach the replica that the
    # session's later calls (routed by its id) reach. The runtimes' own format.
    session_id = session_id or f"sess_{uuid.uuid4().hex[:16]}"
    body = _validated(SessionCreate, messages=list(messages or []), session_id=session_id)
    headers = _bound(session_id)
    if rebuild_reason is not None:
        headers[REBUILD_HEADER] = rebuild_reason
    return Call("POST", "/sessions", model_parser(SessionInfo), json=_dump(body), headers=headers)


def get_session(session_id: str, include_messages: bool) -> Call[SessionInfo]:
    params = {"include_messages": "true"} if include_messages else None
    return Call("GET", _session_path(session_id), model_parser(SessionInfo), params=params,
                headers=_bound(session_id))


def list_sessions() -> Call[list[SessionInfo]]:
    def parse(response: httpx.Response) -> list[SessionInfo]:
        return model_parser(SessionList)(response).sessions

    return Call("GET", "/sessions", parse)


def delete_session(session_id: str) -> Call[None]:
    return Call("DELETE", _session_path(session_id), no_content, headers=_bound(session_id))


def append(
    session_id: str, messages: Sequence[MessageLike], expected_version: int | None
) -> Call[AppendResult]:
    body = _validated(AppendRequest, messages=list(messages), expected_version=expected_version)
    return Call(
        "POST", _session_path(session_id, "/messages"), model_parser(AppendResult), json=_dump(body),
        headers=_bound(session_id),
    )


# Every sampling/decoding option the protocol defines, read from its model so no key list can drift;
# the request fields (history, version, stream) are arguments of their own.
GENERATE_OPTIONS = frozenset(GenerateRequest.model_fields) - {"messages", "expected_version", "stream"}


def generate(
    session_id: str,
    messages: Sequence[MessageLike] | None,
    expected_version: int | None,
    sampling: Mapping[str, Any],
) -> Call[GenerateResponse]:
    _reject_unknown("generate", sampling, GENERATE_OPTIONS)
    body = _validated(
        GenerateRequest,
        messages=list(messages or []),
        expected_version=expected_version,
        **sampling,
    )
    # Only what the caller chose travels, so the runtime's defaults stay the defaults.
    json = _dump(body, include={"messages", "expected_version", *sampling})
    return Call("POST", _session_path(session_id, "/generate"), model_parser(GenerateResponse), json=json,
                headers=_bound(session_id))


def generate_stream(
    session_id: str,
    messages: Sequence[MessageLike] | None,
    expected_version: int | None,
    sampling: Mapping[str, Any],
) -> Call[GenerateResponse]:
    """The streaming generate; its answer is read by :class:`~leyline_sdk._streaming.Stream`
    (``parse`` only reads an answer that is not an event stream)."""
    call = generate(session_id, messages, expected_version, sampling)
    return Call(call.method, call.path, call.parse, json={**call.json, "stream": True}, headers=call.headers)


def apply(
    session_id: str, directives: Sequence[DirectiveLike], expected_version: int | None
) -> Call[DirectiveResult]:
    body = _validated(
        DirectiveBatch,
        session_id=session_id,
        directives=list(directives),
        expected_version=expected_version,
    )
    return Call("POST", "/directives", model_parser(DirectiveResult), json=_dump(body),
                headers=_bound(session_id))


def chat(
    messages: Sequence[MessageLike],
    session_id: str | None,
    mode: Mode | None,
    tools: Sequence[Mapping[str, Any]] | None,
    model: str | None,
    sampling: Mapping[str, Any],
) -> Call[dict[str, Any]]:
    if sampling.get("stream"):
        raise TypeError(
            "chat() does not stream; point an OpenAI client at base_url + '/v1' to stream"
        )
    if mode is not None and mode not in ("amortize", "forget", "auto"):
        raise ValidationFailed(
            f"mode must be 'amortize', 'forget' or 'auto', not {mode!r}", status_code=None
        )
    body: dict[str, Any] = {"messages": [_chat_message(m) for m in messages], **sampling}
    if model is not None:
        body["model"] = model
    if session_id is not None:
        body["session_id"] = session_id
    if mode is not None:
        body["leyline"] = {"mode": mode}
    if tools is not None:
        body["tools"] = [dict(t) for t in tools]
    return Call("POST", "/v1/chat/completions", json_object, json=body,
                headers=_bound(session_id) if session_id is not None else None)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", json_object)


# --- helpers ---------------------------------------------------------------------------------


def _validated(model: type[ModelT], **fields: Any) -> ModelT:
    """Build a request model, turning bad arguments into :class:`ValidationFailed` (client side)."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise ValidationFailed(str(exc), status_code=None) from exc


def _dump(body: pydantic.BaseModel, include: set[str] | None = None) -> dict[str, Any]:
    return body.model_dump(mode="json", exclude_none=True, include=include)


def _chat_message(message: MessageLike) -> dict[str, Any]:
    # OpenAI-shaped dicts pass through untouched (the runtime validates them).
    if isinstance(message, Message):
        return message.model_dump(mode="json", exclude_none=True)
    return dict(message)


def _bound(session_id: str) -> dict[str, str]:
    """The header that routes a call about ``session_id`` (a router hashes on it)."""
    return {SESSION_HEADER: session_id}


def _session_path(session_id: str, suffix: str = "") -> str:
    if not session_id:
        raise ValidationFailed("session_id must not be empty", status_code=None)
    return f"/sessions/{quote(session_id, safe='')}{suffix}"


def _reject_unknown(method: str, kwargs: Mapping[str, Any], known: Collection[str]) -> None:
    # A typo such as max_token=5 would otherwise be dropped silently by pydantic.
    for name in kwargs:
        if name not in known:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
