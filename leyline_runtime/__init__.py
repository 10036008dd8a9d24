"""Leyline runtime: MLA model, paged KV cache, directive executor, HTTP service.

Importing the package is instant and needs no optional dependency (the CLI's
``--help`` relies on that); the model and the HTTP app are imported when
first asked for, after checking that the ``runtime`` extra is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .extras import require

if TYPE_CHECKING:
    from .model import load_model
    from .runtime import Runtime, RuntimeConfig
    from .server import create_app

__all__ = ["Runtime", "RuntimeConfig", "create_app", "load_model"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require("runtime", f"leyline_runtime.{name}")
    if name == "load_model":
        from .model import load_model

        return load_model
    if name == "create_app":
        from .server import create_app

        return create_app
    from . import runtime

    return getattr(runtime, name)
