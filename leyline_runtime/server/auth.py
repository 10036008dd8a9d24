"""Optional API keys; each key is a tenant.

With no keys configured the service is open and everyone is the default
tenant. With keys, a request needs ``Authorization: Bearer <key>`` and acts
as the tenant derived from that key (a hash prefix, so the key itself never
sits in the session table or in logs). Admin keys are keys too (a tenant of
their own); they also see every tenant's ``/metrics``, where other keys see
only their own tenant's series.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from leyline_sdk.errors import Unauthorized

from ..runtime import DEFAULT_TENANT

API_KEYS_ENV = "LEYLINE_API_KEYS"
ADMIN_KEYS_ENV = "LEYLINE_ADMIN_KEYS"

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server was started with keys")


def tenant_of_key(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def keys_from_env(name: str = API_KEYS_ENV) -> list[str]:
    return [k.strip() for k in os.environ.get(name, "").split(",") if k.strip()]


@dataclass(frozen=True)
class Caller:
    tenant: str
    admin: bool  # sees every tenant's metrics


class Authenticator:
    def __init__(self, keys: Iterable[str], admin_keys: Iterable[str] = ()):
        self._admin = {k for k in admin_keys if k}
        self._tenants = {k: tenant_of_key(k) for k in [*keys, *self._admin] if k}

    @property
    def enabled(self) -> bool:
        return bool(self._tenants)

    def caller(self, key: str | None) -> Caller:
        if not self.enabled:
            return Caller(DEFAULT_TENANT, admin=True)  # an open server has one tenant
        if key:
            for known, tenant in self._tenants.items():
                if hmac.compare_digest(known.encode(), key.encode()):
                    return Caller(tenant, admin=known in self._admin)
            raise Unauthorized("invalid API key")
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")

    def tenant(self, key: str | None) -> str:
        return self.caller(key).tenant


def current_caller(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Caller:
    """FastAPI dependency: who is calling, or 401."""
    auth: Authenticator = request.app.state.auth
    return auth.caller(credentials.credentials if credentials else None)


def current_tenant(caller: Annotated[Caller, Depends(current_caller)]) -> str:
    """FastAPI dependency: the caller's tenant, or 401."""
    return caller.tenant
