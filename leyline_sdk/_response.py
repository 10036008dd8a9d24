"""Reading answers: a success body parsed into its model, an error body into its exception.

The runtime's error body is ``{"error": {"code", "message"}}``; anything else (a
proxy's page, a framework's default ``{"detail": ...}``) still becomes the
error class for its status (:func:`~leyline_sdk.errors.error_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pydantic

from ._config import API_KEY_ENV
from .errors import APIStatusError, LeylineError, error_for

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def raise_for_error(response: httpx.Response) -> None:
    if not response.is_success:
        raise error_from_response(response)


def error_from_response(response: httpx.Response) -> LeylineError:
    """The answer's error as an exception carrying the response and its decoded body."""
    code: str | None = None
    message = response.reason_phrase or f"HTTP {response.status_code}"
    body: object
    try:
        body = response.json()
    except ValueError:
        body = response.text
        message = response.text[:500] or message
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            code, message = error["code"], str(error.get("message", message))
        elif "detail" in body:  # a FastAPI default error body
            message = str(body["detail"])
    if response.status_code == 401:
        message = f"{message} ({NO_KEY_HINT if not _sent_a_key(response) else WRONG_KEY_HINT})"
    return error_for(code, message, response.status_code, response=response, body=body)


# The server can only say which header is missing; an SDK user sets the key where the SDK reads it.
NO_KEY_HINT = f"this client sent no API key: set {API_KEY_ENV}, or pass api_key="
WRONG_KEY_HINT = (f"the server knows no such key: the client's comes from api_key= or {API_KEY_ENV}, the "
                  "server's from `leyline-runtime serve --api-key KEY` or LEYLINE_API_KEYS")


def _sent_a_key(response: httpx.Response) -> bool:
    try:
        request = response.request
    except RuntimeError:  # a response built by hand, never sent: nothing to say about its request
        return True
    return "authorization" in request.headers


def model_parser(model: type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    def parse(response: httpx.Response) -> ModelT:
        raise_for_error(response)
        try:
            return model.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise unexpected_body(response, f"not a {model.__name__}: {exc}") from exc

    return parse


def json_object(response: httpx.Response) -> dict[str, Any]:
    raise_for_error(response)
    try:
        payload = response.json()
    except ValueError as exc:
        raise unexpected_body(response, "not JSON") from exc
    if not isinstance(payload, dict):
        raise unexpected_body(response, "not a JSON object")
    return payload


def no_content(response: httpx.Response) -> None:
    raise_for_error(response)


def unexpected_body(response: httpx.Response, why: str, body: object | None = None) -> APIStatusError:
    """A success status whose body is not what the endpoint answers (a proxy, a version mismatch)."""
    return APIStatusError(
        f"unexpected response body ({why})",
        code="invalid_response",
        status_code=response.status_code,
        response=response,
        body=body,
    )
