"""What the engine thread spent its time on: steps, seconds, tokens and sequences by kind of step.

Written by the engine thread only, read at scrape time (``/metrics``). A step is
``decode`` when every sequence in it samples its next token, ``prefill`` when
none does, ``mixed`` otherwise (decode steps beside prefill chunks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("decode", "prefill", "mixed")


@dataclass
class StepTally:
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0  # tokens computed
    sequences: int = 0  # sequences in the steps, summed (decode: / steps = mean batch width)


@dataclass
class EngineStats:
    by_kind: dict[str, StepTally] = field(default_factory=lambda: {kind: StepTally() for kind in KINDS})

    def record(self, decodes: int, sequences: int, tokens: int, seconds: float) -> None:
        """One step: ``decodes`` of its ``sequences`` sampled a token; it computed ``tokens`` in ``seconds``."""
        kind = "decode" if decodes == sequences else ("prefill" if decodes == 0 else "mixed")
        tally = self.by_kind[kind]
        tally.steps += 1
        tally.seconds += seconds
        tally.tokens += tokens
        tally.sequences += sequences
