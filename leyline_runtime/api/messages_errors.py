"""Errors on the Messages API in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

What an error means is decided once, for every ``/v1`` route
(:func:`~leyline_runtime.api.openai_errors.to_openai_error`: its status, and a message naming the
offending field); this module only writes it as Anthropic does. The ``anthropic`` SDK maps the status
to its exception class (400 ``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``,
409 ``ConflictError``, 413 ``RequestTooLargeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from .json_body import content_type_problem
from .openai_errors import invalid_request, to_openai_error

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          503: "overloaded_error", 529: "overloaded_error"}


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


_DESCRIPTIONS: dict[int | str, str] = {
    400: "Invalid request (`invalid_request_error`; the message names the field)",
    401: "Missing or wrong API key (`x-api-key` or `Authorization: Bearer`)",
    404: "An unknown model, or no such session for this key (`not_found_error`)",
    409: "The bound session changed under the request",
    413: "The request cannot fit in the KV cache or the model's context (`request_too_large`)",
    "4XX": "Any other client error, in the same shape",
}


def anthropic_error_responses() -> dict[int | str, dict[str, Any]]:
    return {s: {"model": AnthropicErrorBody, "description": d} for s, d in _DESCRIPTIONS.items()}


def anthropic_error_body(exc: Exception) -> tuple[int, dict[str, Any]]:
    """(status, body) for any exception raised while serving a Messages request."""
    err = to_openai_error(exc)
    kind = _TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return err.status, AnthropicErrorBody(error=AnthropicErrorDetail(type=kind, message=err.message)).model_dump()


class AnthropicRoute(APIRoute):
    """Answers every error of its route in Anthropic's shape (an unexpected one as a 500 ``api_error``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - every error leaves in Anthropic's shape
                if isinstance(exc, RequestValidationError):
                    problem = content_type_problem(request, list(exc.errors()))
                    exc = invalid_request(problem) if problem else exc
                status, body = anthropic_error_body(exc)
                return JSONResponse(body, status_code=status)

        return handle
