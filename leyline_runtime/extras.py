"""Optional dependencies, by the ``leyline-kv`` extra that installs them.

``import leyline_runtime`` and ``leyline-runtime --help`` need none of them.
What does need them calls :func:`require` first, so a missing extra is one
error that says what to install instead of a bare ``ModuleNotFoundError``
from deep inside an import.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "leyline-kv"

# The modules each extra brings, checked without importing them (find_spec is instant).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "runtime": ("torch", "fastapi", "uvicorn", "safetensors", "tokenizers", "prometheus_client", "numpy"),
    "langchain": ("langchain_core", "langchain", "langgraph"),
}


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it."""

    def __init__(self, extra: str, module: str, purpose: str):
        super().__init__(
            f"{purpose} needs the '{extra}' extra ({module} is not installed): from a checkout of the "
            f"repository, pip install -e '.[{extra}]' ({DISTRIBUTION} is on no package index)",
            name=module,
        )
        self.extra = extra


def missing_module(extra: str) -> str | None:
    """The first module of ``extra`` that cannot be imported, or None."""
    for module in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return module
    return None


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` is installed."""
    module = missing_module(extra)
    if module is not None:
        raise MissingExtra(extra, module, purpose)
