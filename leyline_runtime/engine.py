"""Prefill and decode of one sequence against the paged cache.

The engine is stateless about sessions: callers hand it a block table and
how many positions are already cached. Prefill is chunked so a long prompt
never needs one ``[T, T]`` attention matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from leyline_sdk.protocol import SamplingParams

from .kv_cache import BlockPool, BlockTable, ensure_capacity
from .model import DeepseekForCausalLM
from .sampling import LogitsProcessor, SamplerState, sample_token


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" (end token or stop string) | "length"
    stop_string: str | None = None
    # per generated token: (logprob, [(token_id, logprob), ...]) when asked
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


class Engine:
    def __init__(self, model: DeepseekForCausalLM, pool: BlockPool, prefill_chunk: int = 2048):
        self.model = model
        self.pool = pool
        self.prefill_chunk = prefill_chunk

    @property
    def device(self) -> torch.device:
        return self.pool.rows.device

    def prefill(self, table: BlockTable, tokens: list[int], start: int,
                logits: str = "last") -> torch.Tensor | None:
        """Compute rows for ``tokens`` at positions ``start..``; the table must hold them.

        Attention sees the rows of positions ``< start`` already in the table.
        ``logits``: "last" -> [vocab] of the last token, "all" -> [T, vocab], "none".
        """
        if not tokens:
            return None
        end = start + len(tokens)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        all_rows = table.rows(0, end, self.device)
        outs = []
        for s in range(0, len(tokens), self.prefill_chunk):
            e = min(s + self.prefill_chunk, len(tokens))
            last_chunk = e == len(tokens)
            want = logits if logits == "all" else ("last" if last_chunk and logits == "last" else "none")
            out = self.model.forward_cached(
                ids[s:e], torch.arange(start + s, start + e, device=self.device), self.pool.rows,
                all_rows[start + s: start + e], all_rows[: start + e], logits=want)
            if out is not None:
                outs.append(out)
        if logits == "all":
            return torch.cat(outs)
        return outs[-1] if outs else None

    def decode(self, table: BlockTable, num_cached: int, first_logits: torch.Tensor,
               params: SamplingParams, stop_ids: set[int], max_positions: int,
               decode_text=None, on_token: Callable[[int], None] | None = None,
               processors: list[LogitsProcessor] | None = None) -> Generation:
        """Sample from ``first_logits`` on, writing each sampled token's row.

        A sampled stop id ends generation without its row being written (the
        caller decides what closes the message). ``decode_text(ids) -> str`` is
        needed for stop strings. ``on_token(id)`` sees every sampled token (stop
        ids included) as soon as it is chosen; an exception it raises aborts
        the generation. ``processors`` change the logits before each choice (logprobs report
        the model's own distribution).
        """
        sampler = SamplerState.create(params, processors)
        stops = params.stop_strings()
        logits = first_logits
        tokens: list[int] = []
        logprobs = []
        position = num_cached
        while True:
            tok = sample_token(logits, sampler)
            if on_token is not None:
                on_token(tok)
            if params.logprobs:
                logprobs.append(_logprob_entry(logits, tok, params.top_logprobs))
            if tok in stop_ids:
                return Generation(tokens + [tok], "stop", logprobs=logprobs)
            tokens.append(tok)
            if stops and decode_text is not None:
                text = decode_text(tokens)
                hit = next((s for s in stops if s in text), None)
                if hit is not None:
                    return Generation(tokens, "stop", stop_string=hit, logprobs=logprobs)
            if len(tokens) >= params.max_tokens or position + 1 >= max_positions:
                return Generation(tokens, "length", logprobs=logprobs)
            ensure_capacity(self.pool, table, position + 1)
            logits = self.prefill(table, [tok], position)
            position += 1


def _logprob_entry(logits: torch.Tensor, token: int, top: int):
    logp = torch.log_softmax(logits.float(), dim=-1)
    tops = []
    if top:
        values, ids = torch.topk(logp, top)
        tops = list(zip(ids.tolist(), values.tolist()))
    return float(logp[token]), tops
