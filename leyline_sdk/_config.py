"""Client settings: where the runtime is, how to authenticate, how long to wait.

Resolved once per client, from the constructor's arguments first, then the
environment (``LEYLINE_BASE_URL``, ``LEYLINE_API_KEY``), then the defaults here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from .version import __version__

BASE_URL_ENV = "LEYLINE_BASE_URL"
API_KEY_ENV = "LEYLINE_API_KEY"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# Generation can take long; failing to connect should not.
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2


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
        url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
        url = url.removesuffix("/v1")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        if timeout is None:
            resolved = client_timeout or DEFAULT_TIMEOUT
        else:
            resolved = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        return cls(url.rstrip("/"), key, resolved, max_retries, dict(headers or {}))

    def request_headers(self, call_headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """Defaults, then the client's ``headers=``, then the call's own (the session header)."""
        headers = {"Accept": "application/json", "User-Agent": f"leyline-sdk/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(self.headers)
        headers.update(call_headers or {})
        return headers

