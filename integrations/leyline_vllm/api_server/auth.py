"""The plugin's routes check ``vllm serve``'s own API keys.

vLLM's ``--api-key`` (or ``VLLM_API_KEY``) guards only the paths under its own prefixes (``/v1``, ``/v2``,
``/inference``, ``/cohere``: its ``AuthenticationMiddleware``), so Leyline's session routes
(``/sessions``, ``/directives``) would be open on a server started with a key. They check the same keys
here, as vLLM compares them (constant time), and answer 401 in Leyline's error body. ``/healthz`` stays
open, as vLLM's ``/health`` does. There are no tenants on ``vllm serve``: any of its keys is the one
caller.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

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
    sent = hashlib.sha256(credentials.credentials.encode()).digest()
    if not any(hmac.compare_digest(sent, key) for key in keys):
        raise Unauthorized("invalid API key")
