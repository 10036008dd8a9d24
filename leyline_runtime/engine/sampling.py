"""Next-token choice: greedy or temperature / top-k / top-p with a seeded generator.

Every sequence samples through :func:`sample_token` with its own :class:`SamplerState`, so
per-request logits processors (grammar masks, penalties, logit bias) and the seeded generator
travel with the sequence, whether it decodes alone or batched with others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from leyline_sdk.protocol import SamplingParams


class LogitsProcessor(Protocol):
    """Changes one sequence's next-token logits; told which token was then chosen."""

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        """``logits`` [vocab] fp32 -> logits to sample from (may be modified in place)."""
        ...

    def accept(self, token: int) -> None:
        """The token sampled after this call (advance any internal state, e.g. a grammar matcher)."""
        ...


@dataclass
class SamplerState:
    params: SamplingParams
    generator: torch.Generator
    processors: list[LogitsProcessor] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, params: SamplingParams, processors: list[LogitsProcessor] | None = None) -> SamplerState:
        return cls(params, make_generator(params.seed), list(processors or []))


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample_token(logits: torch.Tensor, state: SamplerState) -> int:
    """One sequence's next token: its processors, then its sampling parameters."""
    if state.processors:
        logits = logits.float().clone()
        for processor in state.processors:
            logits = processor(logits, state.generated)
    token = sample_next(logits, state.params, state.generator)
    for processor in state.processors:
        processor.accept(token)
    state.generated.append(token)
    return token


def sample_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    """logits [vocab] (fp32) -> token id."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if bool(scores.max().isinf()):  # so small a temperature (e.g. 5e-324) the scores overflow: its limit
        return int(torch.argmax(logits))
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = sorted_scores.softmax(-1)
        # drop a token once the mass before it already reaches top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= params.top_p
        drop[0] = False  # also when top_p rounds to 0 in float32 (e.g. 5e-324)
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=gen))


class Penalties:
    """OpenAI's presence and frequency penalties over the tokens generated so far."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0):
        self.presence = presence
        self.frequency = frequency

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        if not generated:
            return logits
        ids, counts = torch.tensor(generated, dtype=torch.long).unique(return_counts=True)
        logits[ids] -= self.frequency * counts.to(logits.dtype) + self.presence
        return logits

    def accept(self, token: int) -> None:
        pass


class LogitBias:
    """OpenAI's ``logit_bias``: a fixed offset per token id, added before sampling."""

    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        logits[self.ids] += self.values.to(logits.dtype)
        return logits

    def accept(self, token: int) -> None:
        pass
