"""A session: messages, their token ids, the cache block table, a version."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import accumulate

from leyline_sdk.protocol import Message, Segment, SessionCounters, SessionInfo

from leyline_runtime.auto_rule import DriftState
from leyline_runtime.engine.kv_cache import BlockTable


@dataclass
class Session:
    session_id: str
    tenant: str
    table: BlockTable
    messages: list[Message] = field(default_factory=list)
    # Per-message token ids (header + body + end). Tokens the runtime generated
    # are canonical for their assistant message.
    message_tokens: list[list[int]] = field(default_factory=list)
    version: int = 0
    counters: SessionCounters = field(default_factory=SessionCounters)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0  # requests holding or waiting for it; a busy session is never evicted
    drift: DriftState = field(default_factory=DriftState)  # what its auto edits left (see drift.py)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.message_tokens)

    @property
    def tokens(self) -> list[int]:
        return [t for toks in self.message_tokens for t in toks]

    def offsets(self) -> list[int]:
        """Token start of each message, plus the total at the end."""
        return [0, *accumulate(len(t) for t in self.message_tokens)]

    def segments(self) -> list[Segment]:
        off = self.offsets()
        return [Segment(index=i, message_id=m.id, role=m.role, start=off[i], end=off[i + 1])
                for i, m in enumerate(self.messages)]

    def info(self, include_messages: bool = False) -> SessionInfo:
        return SessionInfo(
            session_id=self.session_id, version=self.version, num_tokens=self.num_tokens,
            num_messages=len(self.messages), segments=self.segments(),
            counters=self.counters.model_copy(), drift=self.drift.info(),
            messages=[m.model_copy() for m in self.messages] if include_messages else None)
