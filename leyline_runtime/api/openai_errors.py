"""Errors on ``/v1`` in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

OpenAI clients map the status to an exception class (400 -> ``BadRequestError``,
401 -> ``AuthenticationError``, 404 -> ``NotFoundError``, 409 -> ``ConflictError``),
so an invalid request is a 400 here, as at OpenAI and vLLM, where the native routes
answer 422 with ``{"error": {"code", "message"}}`` (see :mod:`.errors`). The
mapping lives in the ``/v1`` route class (:class:`OpenAIRoute`), apart from the app's
handlers, so the chat route answers the same errors on every engine (the bundled
runtime's ``/v1`` router, the vLLM plugin's session-bound chat).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from leyline_sdk.errors import LeylineError

from .errors import UNPARSEABLE_BODY, body_problem, validation_text
from .json_body import content_type_problem

log = logging.getLogger("leyline.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          409: "conflict_error", 413: "invalid_request_error", 500: "server_error", 503: "server_error"}


class OpenAIError(Exception):
    """An error to answer in OpenAI's shape; ``param`` names the offending request field."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def invalid_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(message, param=param, code="invalid_request")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


_DESCRIPTIONS: dict[int | str, str] = {
    400: "Invalid request (`param` names the field); an empty body or one that is not JSON is `invalid_body`",
    401: "Missing or wrong API key",
    404: "No such session for this tenant (`session_not_found`), or an unknown model (`model_not_found`)",
    409: "The session changed under the request (`version_conflict`)",
    413: "The request cannot fit in the KV cache, or in the model's context (`capacity_exceeded`)",
    "4XX": "Any other client error, in the same shape",
}


def openai_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    # "4XX" also keeps FastAPI from documenting a 422 this router never sends
    listed: list[int | str] = [*sorted({400, 401, *statuses}), "4XX"]
    return {s: {"model": OpenAIErrorBody, "description": _DESCRIPTIONS[s]} for s in listed}


def error_body(exc: Exception) -> tuple[int, dict[str, Any]]:
    """(status, body) for any exception raised while serving a ``/v1`` request."""
    err = to_openai_error(exc)
    detail = OpenAIErrorDetail(message=err.message, type=_TYPES.get(err.status, "invalid_request_error"),
                               param=err.param, code=err.code)
    return err.status, {"error": detail.model_dump()}


def to_openai_error(exc: Exception) -> OpenAIError:
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _from_validation(exc.errors())
    if isinstance(exc, StarletteHTTPException):  # e.g. a body that is not UTF-8 or nested too deep
        if exc.status_code == 400:
            return OpenAIError(UNPARSEABLE_BODY, code="invalid_body")
        return OpenAIError(str(exc.detail), status=exc.status_code)
    if isinstance(exc, LeylineError):  # invalid input is a 400; 404, 409, 413 keep their meaning
        status = exc.status_code or 400
        return OpenAIError(exc.message or exc.code, code=exc.code, status=400 if status == 422 else status)
    if isinstance(exc, (ValueError, IndexError, OverflowError)):
        return OpenAIError(str(exc) or type(exc).__name__, code="invalid_request")
    log.error("unhandled error on /v1", exc_info=exc)
    return OpenAIError("internal error", code="internal_error", status=500)


def _from_validation(errors: Any) -> OpenAIError:
    errors = list(errors)
    if (problem := body_problem(errors)) is not None:
        return OpenAIError(problem, code="invalid_body")
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[1] if loc[:1] == ["header"] and len(loc) > 1 else _param_path(loc)
    if first.get("type") == "extra_forbidden":
        message = f"`{param}` is not supported by this server"
    else:
        message = f"{param}: {validation_text(first)}" if param else validation_text(first)
    if len(errors) > 1:
        message += f" (+{len(errors) - 1} more)"
    return OpenAIError(message, param=param, code="invalid_request")


_SCALARS = {"str", "int", "float", "bool"}  # how pydantic names a plain union member


def _param_path(loc: list[str]) -> str | None:
    """``["messages", "0", "role"]`` -> ``messages[0].role``; union branch names dropped."""
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif part[:1].isupper() or "[" in part or part.startswith(("function-", "literal[")) or part in _SCALARS:
            continue  # pydantic names the union member it tried; not a field
        else:
            out += f".{part}" if out else part
    return out or None


_KNOWN = (OpenAIError, RequestValidationError, StarletteHTTPException, LeylineError, ValueError, IndexError,
          OverflowError)


class OpenAIRoute(APIRoute):
    """Answers every error of its route in OpenAI's shape (an unexpected one as a 500 ``internal_error``)."""

    answers_unexpected_errors = True

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - every error leaves in OpenAI's shape
                if not (self.answers_unexpected_errors or isinstance(exc, _KNOWN)):
                    raise
                if isinstance(exc, RequestValidationError):
                    problem = content_type_problem(request, list(exc.errors()))
                    exc = invalid_request(problem) if problem else exc
                status, body = error_body(exc)
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                return JSONResponse(body, status_code=status, headers=headers)

        return handle


class OpenAIKnownErrorsRoute(OpenAIRoute):
    """Answers the errors Leyline knows in OpenAI's shape and lets any other reach the app's own
    handlers: a route inside an app that is not ours (``vllm serve``, whose handlers act on its engine's
    failures)."""

    answers_unexpected_errors = False
