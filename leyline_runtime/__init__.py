"""Leyline runtime: MLA model, paged KV cache, directive executor, HTTP service."""

from typing import TYPE_CHECKING, Any

from .model import load_model

if TYPE_CHECKING:
    from .server import create_app

__all__ = ["create_app", "load_model"]


def __getattr__(name: str) -> Any:
    # The HTTP layer (FastAPI) is only imported when asked for.
    if name == "create_app":
        from .server import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
