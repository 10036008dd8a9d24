"""Optional API keys; each key is a tenant.

With no keys configured the service is open and everyone is the default
tenant. With keys, a request needs ``Authorization: Bearer <key>`` and acts
as the tenant derived from that key (a hash prefix, so the key itself never
sits in the session table or in logs).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from leyline_sdk.errors import Unauthorized

from ..runtime import DEFAULT_TENANT

API_KEYS_ENV = "LEYLINE_API_KEYS"

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server was started with keys")


def tenant_of_key(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def keys_from_env() -> list[str]:
    return [k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip()]


class Authenticator:
    def __init__(self, keys: Iterable[str]):
        self._tenants = {k: tenant_of_key(k) for k in keys if k}

    @property
    def enabled(self) -> bool:
        return bool(self._tenants)

    def tenant(self, key: str | None) -> str:
        if not self.enabled:
            return DEFAULT_TENANT
        if key:
            for known, tenant in self._tenants.items():
                if hmac.compare_digest(known.encode(), key.encode()):
                    return tenant
            raise Unauthorized("invalid API key")
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")


def current_tenant(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """FastAPI dependency: the caller's tenant, or 401."""
    auth: Authenticator = request.app.state.auth
    return auth.tenant(credentials.credentials if credentials else None)
