"""The four ways to serve an agent's turn, each on its own runtime session.

Every arm answers one turn (the full history the agent sends) with a
:class:`TurnStats`: prompt tokens, tokens whose cache rows were reused,
tokens prefilled, and the time to first token — syncing the cache with the
history, then ``generate(max_tokens=1)`` (the assistant header's prefill and
the first sampled token). The generated message is removed again afterwards
(untimed, a deletion at the very end), since the agent's next history does
not contain it.

* ``no_cache`` — a fresh session every turn (prefill everything);
* ``prefix_cache`` — reuse up to the first differing token, as vLLM/SGLang do:
  one ``forget`` directive from the first changed message to the end (the
  runtime's token-level minimisation keeps the common tokens of that message),
  so everything after the first differing token is really prefilled again;
* ``leyline_amortize`` / ``leyline_forget`` — ``split_append`` diffs the session's
  messages against the new history, the directives run in that mode, the tail is appended.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from leyline_sdk.diff import split_append
from leyline_sdk.protocol import (
    Directive,
    DirectiveBatch,
    GenerateRequest,
    Message,
    SessionCreate,
    Span,
)

from leyline_runtime.runtime import Runtime

TENANT = "__bench_replay__"
FIRST_TOKEN = GenerateRequest(max_tokens=1, temperature=0.0)


@dataclass
class TurnStats:
    prompt_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    rotated_tokens: int
    directives: int
    sync_s: float
    ttft_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def history_tokens(runtime: Runtime, messages: list[Message]) -> list[int]:
    return [t for ids in runtime.tokenizer.encode_messages(messages) for t in ids]


class ReplayArm:
    """One cache arm of the replay bench: how a session is brought to each turn's history, timed per turn."""

    name = ""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.session_id: str | None = None

    def turn(self, history: list[Message]) -> TurnStats:
        prompt = len(history_tokens(self.runtime, history))
        t0 = time.perf_counter()
        prefilled, rotated, directives = self.sync(history)
        t1 = time.perf_counter()
        self.runtime.generate(self.session_id, FIRST_TOKEN, TENANT)
        t2 = time.perf_counter()
        self.after_generate()
        return TurnStats(prompt, prompt - prefilled, prefilled, rotated, directives, t1 - t0, t2 - t0)

    def sync(self, history: list[Message]) -> tuple[int, int, int]:
        """Make the session hold ``history``; returns (prefilled, rotated, directives)."""
        raise NotImplementedError

    def after_generate(self) -> None:
        """Drop the one generated message: a deletion at the end moves and prefills nothing."""
        messages, _ = self.runtime.session_messages(self.session_id, TENANT)
        n = len(messages)
        self.runtime.apply(DirectiveBatch(session_id=self.session_id,
                                          directives=[Directive(span=Span(start=n - 1, end=n))]), TENANT)

    def close(self) -> None:
        if self.session_id and self.runtime.has_session(self.session_id, TENANT):
            self.runtime.delete_session(self.session_id, TENANT)
        self.session_id = None

    def _create(self, history: list[Message]) -> int:
        self.session_id = self.runtime.create_session(SessionCreate(messages=history), TENANT).session_id
        return len(history_tokens(self.runtime, history))


class NoCache(ReplayArm):
    name = "no_cache"

    def sync(self, history):
        self.close()
        return self._create(history), 0, 0

    def after_generate(self) -> None:
        self.close()


class PrefixCache(ReplayArm):
    name = "prefix_cache"

    def sync(self, history):
        if self.session_id is None:
            return self._create(history), 0, 0
        old, _ = self.runtime.session_messages(self.session_id, TENANT)
        i = next((k for k, (a, b) in enumerate(zip(old, history)) if a.fingerprint() != b.fingerprint()),
                 min(len(old), len(history)))
        if i == len(old):  # a pure append
            return self._append(history[i:]), 0, 0
        forget = Directive(span=Span(start=i, end=len(old)), replacement=history[i:], mode="forget")
        result = self.runtime.apply(DirectiveBatch(session_id=self.session_id, directives=[forget]), TENANT)
        return sum(o.recomputed_tokens for o in result.outcomes), 0, 1

    def _append(self, messages: list[Message]) -> int:
        if not messages:
            return 0
        return self.runtime.append(self.session_id, messages, TENANT).usage.prefill_tokens


class Leyline(PrefixCache):
    def __init__(self, runtime: Runtime, mode: str):
        super().__init__(runtime)
        self.mode = mode
        self.name = f"leyline_{mode}"

    def sync(self, history):
        if self.session_id is None:
            return self._create(history), 0, 0
        old, _ = self.runtime.session_messages(self.session_id, TENANT)
        directives, tail = split_append(old, history, mode=self.mode)
        prefilled = rotated = 0
        if directives:
            result = self.runtime.apply(DirectiveBatch(session_id=self.session_id, directives=directives), TENANT)
            prefilled += sum(o.recomputed_tokens for o in result.outcomes)
            rotated += sum(o.rotated_tokens for o in result.outcomes)
        return prefilled + self._append(tail), rotated, len(directives)


ARMS = ("no_cache", "prefix_cache", "leyline_amortize", "leyline_forget")


def make_arm(name: str, runtime: Runtime) -> ReplayArm:
    if name == "no_cache":
        return NoCache(runtime)
    if name == "prefix_cache":
        return PrefixCache(runtime)
    if name.startswith("leyline_"):
        return Leyline(runtime, name.removeprefix("leyline_"))
    raise ValueError(f"unknown arm {name!r}")
