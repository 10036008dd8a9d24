"""The FastAPI application: one runtime, its metrics, auth, routes, error shapes."""

from __future__ import annotations

import time

from fastapi import FastAPI

from leyline_sdk.version import __version__

from ..metrics import ServiceMetrics
from ..runtime import Runtime, RuntimeConfig
from . import routes_openai, routes_sessions, routes_system
from .auth import Authenticator, keys_from_env
from .chat import ChatService
from .errors import install_error_handlers

DESCRIPTION = """\
Leyline: an inference runtime whose sessions can be *edited* through directives
(span, replacement, mode) instead of re-prefilled. Native endpoints manage sessions
and directive batches; `/v1/chat/completions` is OpenAI-compatible and, bound to a
session, turns history edits into directives. Errors are `{"error": {"code", "message"}}`.
"""


def create_app(config: RuntimeConfig | None = None, *, runtime: Runtime | None = None) -> FastAPI:
    """The service for ``runtime`` (or a new runtime built from ``config``).

    API keys come from ``config.api_keys`` (the runtime's config when only a
    runtime is given), else from the ``LEYLINE_API_KEYS`` environment variable.
    """
    if runtime is None:
        runtime = Runtime(config)
    config = config or runtime.config
    app = FastAPI(title="Leyline runtime", version=__version__, description=DESCRIPTION)
    app.state.runtime = runtime
    app.state.metrics = metrics = ServiceMetrics(runtime)
    app.state.chat = ChatService(runtime, metrics)
    app.state.auth = Authenticator(config.api_keys or keys_from_env())
    app.state.started = int(time.time())
    install_error_handlers(app)
    for module in (routes_sessions, routes_openai, routes_system):
        app.include_router(module.router)
    return app
