"""One generation's sampling and stop rules, advanced one sampled token at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from leyline_sdk.protocol import SamplingParams

from leyline_runtime.engine.sampling import LogitsProcessor, SamplerState, sample_token
from leyline_runtime.text.tokenizer import IncrementalText


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" (end token or stop string) | "length"
    stop_string: str | None = None
    # per generated token: (logprob, [(token_id, logprob), ...]) when asked
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


@dataclass
class GenerationState:
    """What one sequence has generated so far, and when it must stop.

    ``num_cached`` is the position of the first generated token. A stop id
    ends generation without its row being written (the caller decides what
    closes the message); ``decode_text(ids) -> str`` is needed for stop strings.
    """

    params: SamplingParams
    sampler: SamplerState
    stop_ids: set[int]
    num_cached: int
    max_positions: int
    decode_text: Callable[[list[int]], str] | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    text: IncrementalText | None = None  # the tokens' text, kept only for stop strings

    @classmethod
    def create(cls, params: SamplingParams, stop_ids: set[int], num_cached: int, max_positions: int,
               decode_text=None, processors: list[LogitsProcessor] | None = None) -> GenerationState:
        return cls(params, SamplerState.create(params, processors), stop_ids, num_cached, max_positions, decode_text)

    def step(self, logits: torch.Tensor) -> tuple[int, Generation | None]:
        """Sample the next token from ``logits`` [vocab]; -> (token, the finished generation or None)."""
        params = self.params
        choice = logits
        if len(self.tokens) < params.min_tokens and self.stop_ids:  # too early to end the message
            choice = logits.clone()
            choice[list(self.stop_ids)] = float("-inf")
        tok = sample_token(choice, self.sampler)
        if params.logprobs:  # from the model's own distribution, whatever the processors did
            self.logprobs.append(_logprob_entry(logits, tok, params.top_logprobs))
        if tok in self.stop_ids:
            return tok, Generation(self.tokens + [tok], "stop", logprobs=self.logprobs)
        self.tokens.append(tok)
        stops = params.stop_strings()
        if stops and self.decode_text is not None:
            if self.text is None:
                self.text = IncrementalText(self.decode_text)
            self.text.push(tok)
            hit = next((s for s in stops if s in self.text.latest), None)
            if hit is not None:
                return tok, Generation(self.tokens, "stop", stop_string=hit, logprobs=self.logprobs)
        if len(self.tokens) >= params.max_tokens or self.num_cached + len(self.tokens) >= self.max_positions:
            return tok, Generation(self.tokens, "length", logprobs=self.logprobs)
        return tok, None


def _logprob_entry(logits: torch.Tensor, token: int, top: int):
    logp = torch.log_softmax(logits.float(), dim=-1)
    tops = []
    if top:
        values, ids = torch.topk(logp, top)
        tops = list(zip(ids.tolist(), values.tolist()))
    return float(logp[token]), tops
