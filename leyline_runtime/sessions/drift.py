"""A session's drift budget: how much amortize error its ``auto`` edits have left behind.

Every amortized ``auto`` edit adds its measured signal, weighted by depth (see
:mod:`.auto_mode`), to the session's drift; once the sum passes the budget the runtime re-prefills from
the earliest position an amortized edit touched, after which the session's
cache equals an honest prefill of its history again and the drift is zero.
Plain bookkeeping: positions and sums, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from leyline_sdk.protocol import DriftInfo


@dataclass
class DriftState:
    budget: float | None = None  # None: never repair for drift
    drift: float = 0.0
    earliest: int | None = None  # first token position whose rows may be stale
    repairs: int = 0
    repaired_tokens: int = 0

    def copy(self) -> "DriftState":
        return replace(self)

    def info(self) -> DriftInfo:
        return DriftInfo(drift=self.drift, budget=self.budget, earliest_position=self.earliest,
                         repairs=self.repairs, repaired_tokens=self.repaired_tokens)

    def moved(self, new_position: int | None) -> None:
        """The edits of a batch moved the earliest stale token to ``new_position``."""
        self.earliest = new_position

    def amortized(self, position: int, signal: float) -> None:
        """An edit at ``position`` was spliced in place; ``signal``: its measured drift (0 if unmeasured)."""
        self.earliest = position if self.earliest is None else min(self.earliest, position)
        self.drift += signal

    def recomputed_from(self, position: int) -> None:
        """Every row from ``position`` on was recomputed exactly (forget or repair)."""
        if self.earliest is not None and position <= self.earliest:
            self.drift, self.earliest = 0.0, None

    def over_budget(self) -> bool:
        return self.budget is not None and self.earliest is not None and self.drift > self.budget

    def repaired(self, num_tokens: int) -> int:
        """A budget repair re-prefilled from ``earliest`` to the end (``num_tokens``); returns its start."""
        start = self.earliest
        self.repairs += 1
        self.repaired_tokens += num_tokens - start
        self.drift, self.earliest = 0.0, None
        return start
