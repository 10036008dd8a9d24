"""Leyline's HTTP service (FastAPI): native session/directive endpoints and OpenAI chat."""

from ..extras import require

require("runtime", "leyline_runtime.server")

from .app import create_app

__all__ = ["create_app"]
