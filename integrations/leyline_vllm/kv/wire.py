"""The wire between vLLM's processes: the ``kv_transfer_params`` a request carries from the API server
to :class:`~leyline_vllm.kv.connector.LeylineConnector`, and back.

A request's row plan is a list of :class:`RowCopy`: a run of a snapshot's rows moved to new positions
(``delta = dst - src``; the worker rotates the rope part by ``delta``).

``{"leyline": {"session": label, "load": [RowCopy...], "save": key, "release": [key...]}}`` going in;
``{"leyline": {"local_hit", "loaded", "fallback", "saved", "saved_tokens", "residency"}}`` coming back
on the finished request's output (``residency``: the replica's held blocks and host-tier bytes as
this request finished).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# why a held session's rows were released (the scheduler side counts them, /metrics names each)
RELEASE_REASONS = ("dropped", "ttl", "pressure", "budget")

PARAMS_KEY = "leyline"


@dataclass(frozen=True)
class RowCopy:
    src_key: str
    src_start: int
    dst_start: int
    count: int

    delta: int = 0

    @property
    def dst_end(self) -> int:
        return self.dst_start + self.count


def truncate(copies: list[RowCopy], limit: int) -> list[RowCopy]:
    """The copies cut to destination positions ``[0, limit)``."""
    out = []
    for c in copies:
        if c.dst_start >= limit:
            break
        count = min(c.count, limit - c.dst_start)
        out.append(RowCopy(c.src_key, c.src_start, c.dst_start, count, c.delta))
    return out


def covered(copies: list[RowCopy]) -> int:
    """Destination tokens covered from position 0 without a gap."""
    end = 0
    for c in copies:
        if c.dst_start != end:
            break
        end = c.dst_end
    return end


def to_wire(copies: list[RowCopy]) -> list[dict]:
    return [asdict(c) for c in copies]


def from_wire(items: list[dict]) -> list[RowCopy]:
    return [RowCopy(**item) for item in items]




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
