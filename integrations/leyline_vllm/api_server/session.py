"""One Leyline session on vLLM: its history, version, salt, counters, lock and the snapshot of its rows."""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from dataclasses import dataclass, field

from leyline_runtime.auto_rule import DriftState
from leyline_sdk.protocol import Message, SessionCounters

from .row_plan import Snapshot

# The tests' negative control (never set in production): these sessions' approximate rows run unsalted,
# so vLLM's prefix cache may hand them to another request, which the isolation tests must then catch.
# Read once, when the API server imports this module.
UNSALTED_ENV = "LEYLINE_VLLM_TEST_UNSALTED_SESSIONS"
_UNSALTED = frozenset(s for s in os.environ.get(UNSALTED_ENV, "").split(",") if s)


@dataclass
class VllmSession:
    session_id: str
    messages: list[Message] = field(default_factory=list)
    version: int = 0
    salt: str = field(default_factory=lambda: secrets.token_hex(16))
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    snapshot: Snapshot | None = None
    counters: SessionCounters = field(default_factory=SessionCounters)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    drift: DriftState = field(default_factory=DriftState)  # what its amortized auto edits left behind
    _keys: int = 0

    def __post_init__(self) -> None:
        if self.session_id in _UNSALTED:
            self.salt = ""  # run_prompt sends no cache_salt

    def new_key(self) -> str:
        self._keys += 1
        return f"{self.uid}:{self._keys}"
