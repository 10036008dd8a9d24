"""Next-token choice: greedy or temperature / top-k / top-p with a seeded generator."""

from __future__ import annotations

import torch

from leyline_sdk.protocol import SamplingParams


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    """logits [vocab] (fp32) -> token id."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = sorted_scores.softmax(-1)
        # drop a token once the mass before it already reaches top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= params.top_p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=gen))
