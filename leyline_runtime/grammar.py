"""Grammar-constrained decoding: llguidance token masks as logits processors.

A grammar is a Lark text (llguidance's dialect: ``%json{schema}`` embeds a JSON
schema, ``<|tool_call|>`` names a special token). It is compiled once per
distinct text and cached; every request gets its own copy of the compiled
matcher, which advances with each sampled token and masks the logits of
every token the grammar does not allow next. The end-of-message token
(``<|end|>``) is the grammar's end of sequence: allowed only where the
grammar may stop.

Why llguidance: MIT licence, one self-contained wheel (no Python
dependencies), special tokens inside grammars (our tool-call markup is made
of them), JSON schemas embedded in a grammar, and masks in tens of
microseconds per token on this vocabulary (``leyline-bench grammar``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance
import torch

from .tokenizer import ChatTokenizer

CACHE_SIZE = 256
_BITS = torch.tensor([1 << i for i in range(32)], dtype=torch.int64).to(torch.int32)  # bit i of a mask word


class GrammarError(ValueError):
    """The grammar (or a JSON schema inside it) does not compile."""


class GrammarCompiler:
    """Compiles grammars for one tokenizer; keeps the last ``cache_size`` compiled."""

    def __init__(self, tokenizer: ChatTokenizer, cache_size: int = CACHE_SIZE):
        self.vocab_size = tokenizer.vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=self.vocab_size,
                                                eos_token=tokenizer.end_id)
        self.cache_size = cache_size
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compilations = 0  # cache misses, for tests and the bench

    def processor(self, grammar: str) -> GrammarProcessor:
        """A fresh matcher for ``grammar``, as a logits processor; raises :class:`GrammarError`."""
        return GrammarProcessor(self._compile(grammar).deep_copy(), self.vocab_size)

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        with self._lock:
            cached = self._compiled.get(grammar)
            if cached is not None:
                self._compiled.move_to_end(grammar)
                return cached
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self.compilations += 1
            self._compiled[grammar] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return matcher


class GrammarProcessor:
    """Masks every token the grammar does not allow next (see :class:`~.sampling.LogitsProcessor`)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)
        allowed = ((words.unsqueeze(1) & _BITS) != 0).flatten()[: self.vocab_size]
        logits[: self.vocab_size].masked_fill_(~allowed, float("-inf"))
        logits[self.vocab_size:] = float("-inf")  # padded model vocabulary: never a real token
        return logits

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            # only reachable if the sampler picked a masked token (all logits were -inf)
            raise GrammarError(f"token {token} violates the grammar: {self.matcher.get_error()}")


class TokenMask:
    """Forbids a fixed set of tokens (e.g. the chat template's control tokens)."""

    def __init__(self, banned: set[int]):
        self.banned = torch.tensor(sorted(banned), dtype=torch.long)

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        logits[self.banned] = float("-inf")
        return logits

    def accept(self, token: int) -> None:
        pass
