"""Request bodies parsed with orjson.

Parsing JSON holds the GIL, so it runs on the event loop whichever thread
does it: its cost is the longest pause a large body can put on other
requests (``/healthz`` included). orjson parses several times faster than
the standard library. A body orjson refuses goes to the standard parser,
whose outcome FastAPI already maps (a syntax error, invalid UTF-8 or nesting
too deep: 400 ``invalid_body``, see :mod:`.errors`), and a lone surrogate escape
(``"\\ud800"``, which orjson rejects but JSON allows) parses and meets the
field validators, which name the field.

FastAPI reads a body as JSON only under a JSON ``Content-Type``; any other body
fails validation as a whole, and :func:`content_type_problem` says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from email.message import Message as MimeHeader

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = orjson.loads(body)
            except orjson.JSONDecodeError:
                self._json = json.loads(body)
        return self._json


class OrjsonRoute(APIRoute):
    """``APIRouter(route_class=OrjsonRoute)``: its routes parse bodies with orjson."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_with_orjson(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return parse_with_orjson


def content_type_problem(request: Request, errors: list[Any]) -> str | None:
    """Why the body failed validation as a whole, when its ``Content-Type`` is not JSON; else None."""
    if not any(tuple(err.get("loc", ())) == ("body",) for err in errors):
        return None
    declared = request.headers.get("content-type")
    if declared:
        header = MimeHeader()
        header["content-type"] = declared
        subtype = header.get_content_subtype()
        if header.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json")):
            return None
    sent = f"Content-Type {declared!r}" if declared else "no Content-Type"
    return f"the body must be JSON sent with Content-Type: application/json (this request has {sent})"
