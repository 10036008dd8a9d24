"""The ``kv_transfer_params`` a request carries to :class:`LeylineConnector`.

``{"leyline": {"session": label, "load": [RowCopy...], "save": key, "release": [key...]}}`` going in;
``{"leyline": {"local_hit", "loaded", "fallback", "saved", "saved_tokens", "residency"}}`` coming back
on the finished request's output (``residency``: the replica's held blocks and host-tier bytes as
this request finished).
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import RowCopy, to_wire

PARAMS_KEY = "leyline"


def request_params(session: str, load: list[RowCopy], save: str | None, release: list[str] = ()) -> dict:
    return {"kv_transfer_params": {PARAMS_KEY: {"session": session, "load": to_wire(load), "save": save,
                                                "release": list(release)}}}


@dataclass
class LoadReport:
    """What the connector did for one finished request."""

    local_hit: int = 0  # tokens vLLM's own prefix cache supplied
    loaded: int = 0  # tokens the connector loaded (0 after a failed load; the part before a released hold)
    fallback: str | None = None
    saved: str | None = None  # the key its rows are held under (every prompt row has KV)
    saved_tokens: int = 0  # rows saved: the prompt, then the generated tokens whose KV exists
    residency: dict | None = None  # held blocks / bytes, host-tier bytes, releases by reason

    @classmethod
    def from_output(cls, kv_transfer_params: dict | None) -> "LoadReport":
        raw = (kv_transfer_params or {}).get(PARAMS_KEY) or {}
        return cls(raw.get("local_hit", 0), raw.get("loaded", 0), raw.get("fallback"), raw.get("saved"),
                   raw.get("saved_tokens", 0), raw.get("residency"))
