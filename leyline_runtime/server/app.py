"""The FastAPI application: one runtime, its metrics, auth, routes, error shapes."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from leyline_sdk.version import __version__

from ..metrics import ServiceMetrics
from ..runtime import Runtime, RuntimeConfig
from . import routes_messages, routes_openai, routes_sessions, routes_system
from .auth import ADMIN_KEYS_ENV, Authenticator, keys_from_env
from .chat import ChatService
from .durability import restore_sessions, save_sessions
from ..api.continuation import ContinuationIndex
from ..api.errors import install_error_handlers
from .limits import BodyGuard, Limits
from ..api.openapi import install_openapi

DESCRIPTION = """\
Leyline: an inference runtime whose sessions can be *edited* through directives
(span, replacement, mode) instead of re-prefilled. Native endpoints manage sessions
and directive batches; `/v1/chat/completions` is OpenAI-compatible and, bound to a
session, turns history edits into directives; `/v1/messages` is Anthropic's Messages API onto the same
turn. Errors are `{"error": {"code", "message"}}` (OpenAI's and Anthropic's shapes on their routes).
Request limits, timeouts, tenants and durability: see docs/operations.md.
"""

log = logging.getLogger("leyline.server")


def _lifespan(runtime: Runtime, state_dir: str | None):
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state_dir:
            restored, skipped = await run_in_threadpool(restore_sessions, runtime, state_dir)
            log.info("restored %d session(s) from %s (%d skipped)", restored, state_dir, skipped)
        yield
        if state_dir:
            saved = await run_in_threadpool(save_sessions, runtime, state_dir)
            log.info("saved %d session history(ies) to %s", saved, state_dir)

    return lifespan


def create_app(config: RuntimeConfig | None = None, *, runtime: Runtime | None = None,
               limits: Limits | None = None, admin_keys: list[str] | None = None,
               state_dir: str | None = None) -> FastAPI:
    """The service for ``runtime`` (or a new runtime built from ``config``), within ``limits``.

    API keys come from ``config.api_keys`` (the runtime's config when only a
    runtime is given), else from the ``LEYLINE_API_KEYS`` environment variable.
    """
    if runtime is None:
        runtime = Runtime(config)
    config = config or runtime.config
    app = FastAPI(title="Leyline runtime", version=__version__, description=DESCRIPTION,
                  lifespan=_lifespan(runtime, state_dir))
    app.state.state_dir = state_dir
    app.state.runtime = runtime
    app.state.metrics = metrics = ServiceMetrics(runtime)
    app.state.chat = ChatService(runtime, metrics)
    app.state.continuations = ContinuationIndex()  # the Messages API's sessions found by their history
    app.state.auth = Authenticator(config.api_keys or keys_from_env(),
                                   admin_keys or keys_from_env(ADMIN_KEYS_ENV))
    app.state.started = int(time.time())
    app.state.limits = limits = limits or Limits()
    app.add_middleware(BodyGuard, limits=limits)
    install_error_handlers(app)
    for module in (routes_sessions, routes_openai, routes_messages, routes_system):
        app.include_router(module.router)
    install_openapi(app)
    return app
