"""What the sync and async clients share: settings, request building, response parsing, retries.

Every endpoint is described once as a :class:`Call` (method, path, body, how
to read the answer); the two client classes only differ in how they send it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from .version import __version__
from .errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    LeylineError,
    ValidationFailed,
    error_for,
)
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
    SessionInfo,
    SessionList,
)

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)

MessageLike = Message | Mapping[str, Any]
DirectiveLike = Directive | Mapping[str, Any]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# Generation can take long; failing to connect should not.
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.25
MAX_RETRY_DELAY = 4.0

# Errors raised before the request reached the server: retrying them cannot
# apply a directive or append a message twice.
_NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# --- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    api_key: str | None
    timeout: httpx.Timeout
    max_retries: int
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int,
        headers: Mapping[str, str] | None,
        client_timeout: httpx.Timeout | None = None,
    ) -> ClientConfig:
        """Arguments first, then ``LEYLINE_BASE_URL`` / ``LEYLINE_API_KEY``, then defaults.

        The base URL is the server's root. An OpenAI-style base URL ending in
        ``/v1`` is accepted too: the ``/v1`` is dropped, since Leyline's native
        endpoints are unversioned and the client adds ``/v1`` to the
        OpenAI-compatible ones itself.
        """
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        url = (base_url or os.environ.get("LEYLINE_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        url = url.removesuffix("/v1")
        key = api_key if api_key is not None else os.environ.get("LEYLINE_API_KEY") or None
        if timeout is None:
            resolved = client_timeout or DEFAULT_TIMEOUT
        else:
            resolved = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        return cls(url.rstrip("/"), key, resolved, max_retries, dict(headers or {}))

    def request_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": f"leyline-sdk/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(self.headers)
        return headers

    def build_request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]
    ) -> httpx.Request:
        return http.build_request(
            call.method,
            self.base_url + call.path,
            json=call.json,
            params=call.params,
            headers=self.request_headers(),
            timeout=self.timeout,
        )


# --- calls -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One endpoint call, ready to send; ``parse`` turns the response into the result."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None


def create_session(
    messages: Sequence[MessageLike] | None, session_id: str | None
) -> Call[SessionInfo]:
    body = _validated(SessionCreate, messages=list(messages or []), session_id=session_id)
    return Call("POST", "/sessions", _model(SessionInfo), json=_dump(body))


def get_session(session_id: str, include_messages: bool) -> Call[SessionInfo]:
    params = {"include_messages": "true"} if include_messages else None
    return Call("GET", _session_path(session_id), _model(SessionInfo), params=params)


def list_sessions() -> Call[list[SessionInfo]]:
    def parse(response: httpx.Response) -> list[SessionInfo]:
        return _model(SessionList)(response).sessions

    return Call("GET", "/sessions", parse)


def delete_session(session_id: str) -> Call[None]:
    return Call("DELETE", _session_path(session_id), _no_content)


def append(
    session_id: str, messages: Sequence[MessageLike], expected_version: int | None
) -> Call[AppendResult]:
    body = _validated(AppendRequest, messages=list(messages), expected_version=expected_version)
    return Call(
        "POST", _session_path(session_id, "/messages"), _model(AppendResult), json=_dump(body)
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
    return Call("POST", _session_path(session_id, "/generate"), _model(GenerateResponse), json=json)


def generate_stream(
    session_id: str,
    messages: Sequence[MessageLike] | None,
    expected_version: int | None,
    sampling: Mapping[str, Any],
) -> Call[GenerateResponse]:
    """The streaming generate; an event stream is read line by line with :func:`stream_event`,
    any other answer (an error) with :func:`whole_generation`."""
    call = generate(session_id, messages, expected_version, sampling)
    return Call(call.method, call.path, call.parse, json={**call.json, "stream": True})


StreamEvent = str | GenerateResponse  # a text delta, or the finished generation (the last event)


def is_event_stream(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def whole_generation(response: httpx.Response) -> list[StreamEvent]:
    """A non-streamed answer to a streaming generate: its error raised, or its reply as one delta."""
    done = _model(GenerateResponse)(response)
    return [done.message.content, done] if done.message.content else [done]


def stream_event(line: str) -> StreamEvent | None:
    """One SSE line of a streaming generate: a text delta, the final response, or ``None``
    (not a data line); an ``error`` event raises its exception."""
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[5:].strip())
    except ValueError as exc:
        raise APIStatusError(f"unexpected stream event: {line[:200]!r}", code="invalid_response") from exc
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "delta":
        return str(event.get("content", ""))
    if kind == "done":
        try:
            return GenerateResponse.model_validate(event.get("response"))
        except pydantic.ValidationError as exc:
            raise APIStatusError(f"unexpected stream event (not a GenerateResponse): {exc}",
                                 code="invalid_response") from exc
    error = event.get("error") if isinstance(event, dict) else None
    if kind == "error" and isinstance(error, dict):
        raise error_for(str(error.get("code", "api_error")), str(error.get("message", "")), None)
    raise APIStatusError(f"unexpected stream event: {line[:200]!r}", code="invalid_response")


def apply(
    session_id: str, directives: Sequence[DirectiveLike], expected_version: int | None
) -> Call[DirectiveResult]:
    body = _validated(
        DirectiveBatch,
        session_id=session_id,
        directives=list(directives),
        expected_version=expected_version,
    )
    return Call("POST", "/directives", _model(DirectiveResult), json=_dump(body))


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
    return Call("POST", "/v1/chat/completions", _json_object, json=body)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", _json_object)


# --- responses ---------------------------------------------------------------------------


def raise_for_error(response: httpx.Response) -> None:
    if not response.is_success:
        raise error_from_response(response)


def error_from_response(response: httpx.Response) -> LeylineError:
    """The runtime's ``{"error": {"code", "message"}}`` as an exception; tolerant of other bodies."""
    status = response.status_code
    code = _FALLBACK_CODES.get(status, "http_error")
    message = response.reason_phrase or f"HTTP {status}"
    try:
        payload = response.json()
    except ValueError:
        payload = None
        message = response.text[:500] or message
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            code, message = error["code"], str(error.get("message", message))
        elif "detail" in payload:  # a FastAPI default error body
            message = str(payload["detail"])
    return error_for(code, message, status)


# When a body carries no code (a proxy, a framework default page), the status still says something.
_FALLBACK_CODES = {401: "unauthorized", 422: "validation_error"}


def _model(model: type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    def parse(response: httpx.Response) -> ModelT:
        raise_for_error(response)
        try:
            return model.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise _unexpected_body(response, f"not a {model.__name__}: {exc}") from exc

    return parse


def _json_object(response: httpx.Response) -> dict[str, Any]:
    raise_for_error(response)
    try:
        payload = response.json()
    except ValueError as exc:
        raise _unexpected_body(response, "not JSON") from exc
    if not isinstance(payload, dict):
        raise _unexpected_body(response, "not a JSON object")
    return payload


def _no_content(response: httpx.Response) -> None:
    raise_for_error(response)


def _unexpected_body(response: httpx.Response, why: str) -> APIStatusError:
    return APIStatusError(
        f"unexpected response body ({why})",
        code="invalid_response",
        status_code=response.status_code,
    )


# --- retries ---------------------------------------------------------------------------------


def retry_delay_or_raise(exc: httpx.TransportError, attempt: int, config: ClientConfig) -> float:
    """Seconds to wait before the next try, or raise the mapped error.

    Only errors raised before the request reached the server are retried;
    an HTTP status, or a failure after sending, is never retried.
    """
    if attempt >= config.max_retries or not isinstance(exc, _NOT_SENT_ERRORS):
        raise transport_error(exc, config.base_url) from exc
    base = min(INITIAL_RETRY_DELAY * 2.0**attempt, MAX_RETRY_DELAY)
    return base * (
        0.75 + 0.25 * random.random()
    )  # jitter: clients that failed together retry apart


def transport_error(exc: httpx.TransportError, base_url: str) -> APIConnectionError:
    """The error for a request that got no HTTP response; it names the URL and where it came from."""
    message = str(exc) or type(exc).__name__
    try:
        target = f"{exc.request.method} {exc.request.url}"
    except RuntimeError:  # an exception raised without its request
        target = base_url
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out: {target}: {message}", status_code=None)
    return APIConnectionError(
        f"cannot reach the Leyline runtime at {base_url} ({target}: {message}). Is it running "
        f"(`leyline-runtime serve`)? The URL comes from base_url=, else the LEYLINE_BASE_URL "
        f"environment variable, else {DEFAULT_BASE_URL}.",
        status_code=None,
    )


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


def _session_path(session_id: str, suffix: str = "") -> str:
    if not session_id:
        raise ValidationFailed("session_id must not be empty", status_code=None)
    return f"/sessions/{quote(session_id, safe='')}{suffix}"


def _reject_unknown(method: str, kwargs: Mapping[str, Any], known: Collection[str]) -> None:
    # A typo such as max_token=5 would otherwise be dropped silently by pydantic.
    for name in kwargs:
        if name not in known:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
