"""The plugin's routes check ``vllm serve``'s own API keys.

vLLM's ``--api-key`` (or ``VLLM_API_KEY``) guards only the paths under its own prefixes (``/v1``, ``/v2``,
``/inference``, ``/cohere``: its ``AuthenticationMiddleware``), so Leyline's session routes
(``/sessions``, ``/directives``) would be open on a server started with a key. They check the same keys
here, as vLLM compares them (constant time), and answer 401 in Leyline's error body. ``/healthz`` stays
open, as vLLM's ``/health`` does. There are no tenants on ``vllm serve``: any of its keys is the one
caller.

Anthropic's clients send the key as ``x-api-key``, which vLLM's check does not read. On the Messages
paths (``/v1/messages...``) :class:`AnthropicKeys` checks it (or a Bearer key), answers a wrong or
missing one with a 401 in Anthropic's shape, and passes a right one on as ``Authorization: Bearer``,
so vLLM's own check lets it through. It must run outside vLLM's check, which vLLM adds after the
plugins' routes (``build_app``): the plugin adds it once the app is built (``init_state``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from leyline_sdk.errors import Unauthorized

_bearer = HTTPBearer(auto_error=False, description="vllm serve's --api-key, when it was started with one")


def served_keys(args: Any) -> list[bytes]:
    """The keys ``vllm serve`` checks (``--api-key`` over ``VLLM_API_KEY``, as vLLM picks them), hashed."""
    given = getattr(args, "api_key", None)
    keys = [given] if isinstance(given, str) else list(given or [os.environ.get("VLLM_API_KEY")])
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


def require_api_key(request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """FastAPI dependency: nothing on a server without keys; else the caller's Bearer key or 401."""
    keys: list[bytes] = getattr(request.app.state, "leyline_api_keys", [])
    if not keys:
        return
    if credentials is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' (the key vllm serve was started with)")
    if not key_matches(credentials.credentials, keys):
        raise Unauthorized("invalid API key")


def key_matches(sent: str, keys: list[bytes]) -> bool:
    digest = hashlib.sha256(sent.encode()).digest()
    return any(hmac.compare_digest(digest, key) for key in keys)


MESSAGES_PREFIX = "/v1/messages"


class AnthropicKeys:
    """ASGI middleware: the key of a Messages request, from ``x-api-key`` or a Bearer token (see the module
    docstring); ``keys``: :func:`served_keys`, non-empty."""

    def __init__(self, app: ASGIApp, keys: list[bytes]) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].removeprefix(scope.get("root_path", "")) if scope["type"] == "http" else ""
        if not path.startswith(MESSAGES_PREFIX) or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        sent = headers.get("x-api-key") or (bearer if scheme.lower() == "bearer" else "")
        if not sent or not key_matches(sent, self.keys):
            message = "invalid API key" if sent else "missing API key: send 'x-api-key: <key>' or " \
                "'Authorization: Bearer <key>' (the key vllm serve was started with)"
            body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
            return await JSONResponse(body, status_code=401)(scope, receive, send)
        raw = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"authorization", b"x-api-key")]
        scope = {**scope, "headers": [*raw, (b"authorization", f"Bearer {sent}".encode())]}
        await self.app(scope, receive, send)
