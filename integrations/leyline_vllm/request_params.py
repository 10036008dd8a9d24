"""The ``kv_transfer_params`` a request carries to :class:`LeylineConnector`.

``{"leyline": {"session": label, "load": [RowCopy...], "save": key}}`` going in;
``{"leyline": {"local_hit", "loaded", "fallback", "saved", "saved_tokens"}}`` coming back on the
finished request's output.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import RowCopy, to_wire

PARAMS_KEY = "leyline"


def request_params(session: str, load: list[RowCopy], save: str | None) -> dict:
    return {"kv_transfer_params": {PARAMS_KEY: {"session": session, "load": to_wire(load), "save": save}}}


@dataclass
class LoadReport:
    """What the connector did for one finished request."""

    local_hit: int = 0  # tokens vLLM's own prefix cache supplied
    loaded: int = 0  # tokens the connector loaded (0 after a fallback)
    fallback: str | None = None
    saved: str | None = None  # the key, once every prompt row is saved
    saved_tokens: int = 0  # rows saved: the prompt, then the generated tokens whose KV exists

    @classmethod
    def from_output(cls, kv_transfer_params: dict | None) -> "LoadReport":
        raw = (kv_transfer_params or {}).get(PARAMS_KEY) or {}
        return cls(raw.get("local_hit", 0), raw.get("loaded", 0), raw.get("fallback"), raw.get("saved"),
                   raw.get("saved_tokens", 0))
