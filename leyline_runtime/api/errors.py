"""Every error leaves the service as ``{"error": {"code", "message"}}``.

Runtime errors (:class:`LeylineError`) carry their own code and status.
Request validation, unknown paths and wrong methods are reshaped into the
same body (a 405 names every allowed method in ``Allow``), a body that is not
JSON at all (bad syntax, invalid UTF-8, nested too deep) or is empty is 400
``invalid_body`` on every route (:func:`body_problem`), and malformed input that slips past
validation (a ``ValueError``, ``IndexError`` or ``UnicodeError`` deep in the
runtime) is a 422, never a 500.

Written once for every backend: the bundled app installs these as its
exception handlers (:func:`install_error_handlers`), and the session routes
map them themselves (:class:`LeylineErrorRoute`), so they answer the same
body inside an app that is not ours (``vllm serve``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from leyline_sdk.errors import LeylineError
from leyline_sdk.protocol import SESSION_ID_RULE, ErrorBody

from .json_body import content_type_problem

log = logging.getLogger("leyline.server")

# FastAPI answers 400 when the body cannot be parsed at all (invalid UTF-8, JSON nested too deep).
UNPARSEABLE_BODY = "the body is not UTF-8 JSON, or it is nested too deep"
_HTTP_CODES = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
_MAX_LISTED_ERRORS = 5

_DESCRIPTIONS = {
    400: "The body is empty or not parseable JSON: invalid UTF-8, bad syntax, nested too deep (`invalid_body`)",
    401: "Missing or wrong API key (`unauthorized`)",
    404: "No such session for this tenant (`session_not_found`; the message hints when it was evicted)",
    409: "`expected_version` does not match the session's version (`version_conflict`), or a session with this "
         "id exists already (`session_exists`, on create), or the session has nothing to generate after (`empty_prompt`: "
         "no messages, and a chat template that renders no prompt without them); nothing changed",
    408: "The request body did not arrive within the server's body timeout (`request_timeout`)",
    413: "Over a request limit: body, message size, message count or tokens per request "
         "(`request_too_large`); or the session cannot fit the KV cache or the model's context "
         "(`capacity_exceeded`). Nothing changed",
    422: "Invalid request: `validation_error` (also text that is not valid Unicode), `invalid_span`, "
         "`overlapping_spans`, `invalid_directive`, `invalid_request`. Nothing changed",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for a route: the error body for each status."""
    return {s: {"model": ErrorBody, "description": _DESCRIPTIONS[s]} for s in sorted({401, 422, *statuses})}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _leyline_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LeylineError)
    status = exc.status_code or 400
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status in (408, 413):
        headers = {"Connection": "close"}
    return error_response(status, exc.code, exc.message or exc.code, headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if (problem := body_problem(errors)) is not None:
        return error_response(400, "invalid_body", problem)
    return error_response(422, "validation_error", content_type_problem(request, errors)
                          or describe_validation(errors))


def body_problem(errors: list[Any]) -> str | None:
    """What is wrong with the body as a whole, where FastAPI's validation found it empty or not JSON
    (``json_invalid``, whose ``loc`` carries a character offset, not a field); else None."""
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        at = f" at character {loc[1]}" if len(loc) > 1 and loc[1] is not None else ""
        return f"the body is not valid JSON: {(first.get('ctx') or {}).get('error', 'syntax error')}{at}"
    if first.get("type") == "missing" and loc == ("body",):
        return "the body is empty: this route takes a JSON object (Content-Type: application/json)"
    return None


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = getattr(exc, "headers", None)
    detail = str(exc.detail)
    if exc.status_code == 400:
        detail = UNPARSEABLE_BODY
    if exc.status_code == 404 and (openai_path := _under_v1(request)):
        detail = f"{detail}: the OpenAI-compatible routes live under /v1, this one is {openai_path} " \
                 "(an OpenAI client's base_url ends in /v1)"
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    return error_response(exc.status_code, code, detail, headers)


def _under_v1(request: Request) -> str | None:
    """``/v1`` + the path, when a route serves that: a client whose base URL lacks ``/v1``."""
    path = "/v1" + request.url.path
    if request.url.path.startswith("/v1/"):
        return None
    scope = {**request.scope, "path": path}
    for route in _leaf_routes(request.app.router.routes):
        if route.matches(scope)[0] != Match.NONE:
            return path
    return None


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in _leaf_routes(request.app.router.routes):
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= route.methods
    return sorted(methods)


def _leaf_routes(routes: Any) -> Any:
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI keeps included routers whole
        if included is not None:
            yield from _leaf_routes(included.routes)
        else:
            yield route


async def _bad_input(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, UnicodeError):
        return error_response(422, "validation_error", f"text is not valid Unicode: {exc}")
    return error_response(422, "invalid_request", str(exc) or type(exc).__name__)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error")


_BAD_INPUT = (ValueError, IndexError, OverflowError, RecursionError)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(LeylineError, _leyline_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for bad_input in _BAD_INPUT:
        app.add_exception_handler(bad_input, _bad_input)
    app.add_exception_handler(Exception, _internal_error)


def install_method_not_allowed(app: FastAPI, routes: list[Any]) -> None:
    """Inside an app that is not ours (``vllm serve``): a 405 on a path one of ``routes`` serves gets
    Leyline's answer, every allowed method in ``Allow`` (Starlette names only the first matching
    route's, and a path's GET and POST are two routes); any other path keeps FastAPI's own. A 405 is
    raised by the router before any route runs, so no route class can map it."""

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        ours = any(route.matches({**request.scope, "method": "GET"})[0] != Match.NONE
                   for route in _leaf_routes(routes))
        return await (_http_error(request, exc) if ours else http_exception_handler(request, exc))  # type: ignore[arg-type]

    app.add_exception_handler(405, method_not_allowed)


# pydantic's own words for a session id would be its regex; the rule in words is clearer.
SESSION_HEADER = "X-Leyline-Session"
_SESSION_ID_ERRORS = {"string_pattern_mismatch", "string_too_short", "string_too_long"}


def validation_text(err: dict[str, Any]) -> str:
    """What one pydantic error says, in words a caller can act on."""
    loc = err.get("loc", ())
    if loc and loc[-1] in ("session_id", SESSION_HEADER) and err.get("type") in _SESSION_ID_ERRORS:
        return f"a session id is {SESSION_ID_RULE}"
    return str(err.get("msg", "invalid"))


class LeylineErrorRoute(APIRoute):
    """A route that answers its errors in Leyline's body itself (as the handlers above would)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def mapped(request: Request) -> Response:
            try:
                return await handler(request)
            except LeylineError as exc:
                return await _leyline_error(request, exc)
            except RequestValidationError as exc:
                return await _validation_error(request, exc)
            except StarletteHTTPException as exc:
                return await _http_error(request, exc)
            except _BAD_INPUT as exc:
                return await _bad_input(request, exc)

        return mapped


def describe_validation(errors: Any) -> str:
    """``body.messages.0.role: Input should be ...; ...`` for the first few errors."""
    parts = []
    for err in list(errors)[:_MAX_LISTED_ERRORS]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {validation_text(err)}" if where else validation_text(err))
    more = len(errors) - _MAX_LISTED_ERRORS
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts) or "invalid request"
