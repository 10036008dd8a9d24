"""Grammar-constrained decoding: llguidance token masks as logits processors.

A grammar is a Lark text (llguidance's dialect: ``%json{schema}`` embeds a JSON
schema, ``<|tool_call|>`` names a special token). It is compiled once per
distinct text and cached; every request gets its own copy of the compiled
matcher, which advances with each sampled token and masks the logits of
every token the grammar does not allow next. The end-of-message token
(``<|end|>``) is the grammar's end of sequence: allowed only where the
grammar may stop.

A grammar that knows the reply's token budget (``max_tokens``) also makes sure
the reply parses when the budget runs out: near the end it estimates how many
tokens the shortest way to finish the structure takes (a greedy walk on a copy
of the matcher: close strings and containers, take forced tokens), and once
that no longer fits comfortably it *closes*: from then on it only allows the
closing tokens (``"``, ``}``, ``]``, the end markers) wherever the grammar
allows one, and otherwise what the grammar forces (the keys a schema still
requires). The reply is cut short, so it reports ``finish_reason`` "length",
but it is valid against its schema, where an unconstrained cut would leave
half a JSON value.

Why llguidance: MIT licence, one self-contained wheel (no Python
dependencies), special tokens inside grammars (our tool-call markup is made
of them), JSON schemas embedded in a grammar, and masks in tens of
microseconds per token on this vocabulary (``leyline-bench grammar``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import llguidance
import torch

from leyline_runtime.text.tokenizer import ChatTokenizer

CACHE_SIZE = 256
CLOSING_WINDOW = 64  # the last tokens of a budget, where the closing estimate runs (a mask per walk step)
CLOSING_EVERY = 4  # ... every this many tokens
CLOSING_SLACK = 4  # tokens of margin: the model's own choices may be longer than the walk's
CLOSERS = set('"}]')
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
        self.closers = Closers.of(tokenizer)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compilations = 0  # cache misses, for tests and the bench

    def processor(self, grammar: str, max_tokens: int | None = None) -> GrammarProcessor:
        """A fresh matcher for ``grammar``, as a logits processor; raises :class:`GrammarError`.
        With ``max_tokens`` (the reply's budget) the reply is closed in time to parse."""
        return GrammarProcessor(self._compile(grammar).deep_copy(), self.vocab_size, self.closers, max_tokens)

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


class Closers:
    """What closing needs to know of the vocabulary: each token's text, and which tokens close.

    A closer is a token whose text is only ``"``, ``}`` and ``]`` (e.g. ``"}``), or an end marker.
    Inside a string only a closer with a quote ends it; outside, a quote would open one.
    """

    def __init__(self, texts: list[str], mask: torch.Tensor, quoted: torch.Tensor, ends: torch.Tensor,
                 end_id: int, resets: set[int]):
        self.texts = texts
        self.mask = mask  # [vocab] bool: closers
        self.quoted = quoted  # [vocab] bool: closers with a quote
        self.ends = ends  # [vocab] bool: the end markers (of the message, of a tool call)
        self.end_id = end_id  # the end of the message: the grammar's end of sequence
        self.resets = resets  # the tool-call markers: a new JSON value starts after them

    @classmethod
    def of(cls, tokenizer: ChatTokenizer) -> Closers:
        texts = tokenizer.tokenizer.decode_batch([[i] for i in range(tokenizer.vocab_size)],
                                                 skip_special_tokens=False)
        markers = {tokenizer.end_id, tokenizer.end_tool_call_id}
        mask = torch.tensor([bool(t) and set(t) <= CLOSERS or i in markers for i, t in enumerate(texts)])
        quoted = mask & torch.tensor(['"' in t for t in texts])
        ends = torch.tensor([i in markers for i in range(len(texts))])
        return cls(texts, mask, quoted, ends, tokenizer.end_id, {tokenizer.tool_call_id, tokenizer.end_tool_call_id})

    def choices(self, allowed: torch.Tensor, in_string: bool) -> torch.Tensor:
        """The closing moves among ``allowed`` (may be empty: then the grammar forces the way).

        Where an end marker is allowed, only the end markers: free text after a closed tool
        call allows ``]`` and ``}`` too, and writing them would not close anything."""
        ends = allowed & self.ends
        if ends.any():
            return ends
        return allowed & (self.quoted if in_string else self.mask & ~self.quoted)


@dataclass
class StringScan:
    """Whether the JSON written so far ends inside a string (quotes and escapes, nothing else)."""

    in_string: bool = False
    escaped: bool = False

    def feed(self, text: str) -> None:
        for ch in text:
            if self.escaped:
                self.escaped = False
            elif ch == "\\" and self.in_string:
                self.escaped = True
            elif ch == '"':
                self.in_string = not self.in_string

    def after(self, token: int, closers: Closers) -> StringScan:
        if token in closers.resets:
            return StringScan()
        scan = StringScan(self.in_string, self.escaped)
        scan.feed(closers.texts[token])
        return scan


class GrammarProcessor:
    """Masks every token the grammar does not allow next (see :class:`~.sampling.LogitsProcessor`);
    with a budget, closes the structure before the budget ends (module docstring)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, closers: Closers,
                 max_tokens: int | None = None):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.closers = closers
        self.max_tokens = max_tokens
        self.scan = StringScan()
        self.closing = False  # the budget ran short: only closing moves from here on

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        allowed = _allowed(self.matcher, self.vocab_size)
        # Where the message may end, a cut leaves a valid reply: nothing to close (free text).
        if self.max_tokens is not None and not self.closing and not allowed[self.closers.end_id]:
            left = self.max_tokens - len(generated)
            due = left <= CLOSING_WINDOW and left % CLOSING_EVERY == 0 or left <= CLOSING_SLACK
            self.closing = due and self._closing_length(left) + CLOSING_SLACK + CLOSING_EVERY >= left
        if self.closing:
            # the shortest way on: a closing move, else the walk's own move (what the grammar
            # forces, or its first allowed token): the model's free choice could take longer
            moves = _shortest_moves(self.matcher, allowed, self.scan, self.closers)
            if moves and allowed[moves[0]]:
                allowed = torch.zeros_like(allowed)
                allowed[moves[0]] = True
        logits[: self.vocab_size].masked_fill_(~allowed, float("-inf"))
        logits[self.vocab_size:] = float("-inf")  # padded model vocabulary: never a real token
        return logits

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            # only reachable if the sampler picked a masked token (all logits were -inf)
            raise GrammarError(f"token {token} violates the grammar: {self.matcher.get_error()}")
        if self.max_tokens is not None and token < self.vocab_size:
            self.scan = self.scan.after(token, self.closers)

    def _closing_length(self, limit: int) -> int:
        """Tokens a greedy closing walk takes to finish the structure (more than ``limit``: gave up)."""
        walk, scan, steps = self.matcher.deep_copy(), self.scan, 0
        while steps <= limit and not walk.is_accepting():
            moves = _shortest_moves(walk, _allowed(walk, self.vocab_size), scan, self.closers)
            if not moves or not walk.consume_tokens(moves):
                return limit + 1
            for move in moves:
                scan = scan.after(move, self.closers)
            steps += len(moves)
        return steps


def _shortest_moves(matcher: llguidance.LLMatcher, allowed: torch.Tensor, scan: StringScan,
                    closers: Closers) -> list[int]:
    """The next moves of a greedy closing walk: a closer, else the tokens the grammar forces,
    else its first allowed token (an empty list: nothing allowed)."""
    closing = closers.choices(allowed, scan.in_string)
    if closing.any():
        return [int(closing.nonzero()[-1])]
    return matcher.compute_ff_tokens() or ([int(allowed.nonzero()[0])] if allowed.any() else [])


def _allowed(matcher: llguidance.LLMatcher, vocab_size: int) -> torch.Tensor:
    words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
    return ((words.unsqueeze(1) & _BITS) != 0).flatten()[:vocab_size]


class TokenMask:
    """Forbids a fixed set of tokens (e.g. the chat template's control tokens)."""

    def __init__(self, banned: set[int]):
        self.banned = torch.tensor(sorted(banned), dtype=torch.long)

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        logits[self.banned] = float("-inf")
        return logits

    def accept(self, token: int) -> None:
        pass
