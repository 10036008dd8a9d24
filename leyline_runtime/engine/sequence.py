"""A sequence: one unit of engine work, the bookkeeping the scheduler moves around.

Either a run of known tokens to compute into a block table (a prefill, which
may return logits), or a generation, which computes each token it samples.
The thread that submitted it waits on ``done``.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from leyline_runtime.engine.generation import GenerationState
from leyline_runtime.engine.kv_cache import BlockTable


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    table: BlockTable
    start: int  # position of tokens[0]
    tokens: list[int]  # tokens whose rows this sequence computes (a generation appends what it samples)
    logits: str = "none"  # prefill: "none" | "last" | "all"
    generation: GenerationState | None = None
    first_logits: torch.Tensor | None = None  # a generation samples its first token from these
    after: Sequence | None = None  # an earlier run on the same table: never computed ahead of it
    status: Status = Status.WAITING
    num_computed: int = 0
    outputs: list[torch.Tensor] = field(default_factory=list)
    on_token: Callable[[int], None] | None = None  # a generation's hook: called on the engine thread
    # to the submitting thread, once: ("done", result) | ("error", exception)
    done: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    @property
    def num_pending(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def position(self) -> int:
        """Position of the next token to compute."""
        return self.start + self.num_computed

    def wants_logits(self, n: int) -> int:
        """How many of the next ``n`` computed tokens need logits (the last ones)."""
        if self.generation is not None:
            return 1
        if self.logits == "all":
            return n
        return 1 if self.logits == "last" and n == self.num_pending else 0
