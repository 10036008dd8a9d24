"""A session-bound chat turn, decided once for every engine: what the turn does, and what it did.

A bound request carries the whole history, as OpenAI clients do. :func:`plan_chat_turn`
compares it with what the engine holds for the session (under the session's lock) and
says what the turn does:

* the engine does not hold the session: **build** it from the request (``built``). It is
  also ``rebuilt`` when it had existed: this server's cache evicted it (``evicted``), or the
  history already holds an assistant reply that this server never saw: it was served
  elsewhere (another replica, this one before a restart: ``unknown_session``);
* it holds it, and the edit needs more than ``MAX_DIRECTIVES`` directives: drop what it
  holds and build the session afresh from the request (``rebuilt``, ``too_many_edits``; not
  ``built``: the server held it);
* otherwise **edit** it: the directive batch of :func:`leyline_sdk.batch_plan.plan_batch`
  (the planner ``LeylineMemory`` uses too, so the same edit sends the same batch), id-only
  edits renamed locally, then the new tail appended and the reply generated.

Each engine runs the plan its own way (the bundled runtime: a directive batch, then a
generation; vLLM: both in one pass) and answers a :class:`ChatTurn`, from which the
response is built (:mod:`.chat_response`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from leyline_sdk.batch_plan import BatchPlan, plan_batch
from leyline_sdk.protocol import Directive, DirectiveOutcome, GenerateResponse, Message, Mode

from .chat_request import AppliedEdit

RebuildReason = Literal["evicted", "unknown_session", "too_many_edits"]


@dataclass(frozen=True)
class TurnPlan:
    """What a bound turn does to its session (see the module docstring).

    ``messages``: the request's history, which the session holds once the turn is done (then
    the reply). ``build``: build the session from ``messages``, after dropping what the engine
    holds, if anything; otherwise ``batch`` edits it (``directives`` sent, ``local`` renames
    applied to the engine's copy, ``tail`` appended)."""

    messages: list[Message]
    build: bool
    built: bool = False
    rebuild_reason: RebuildReason | None = None
    batch: BatchPlan = field(default_factory=BatchPlan)

    @property
    def rebuilt(self) -> bool:
        return self.rebuild_reason is not None

    @property
    def directives(self) -> list[Directive]:
        return self.batch.directives

    @property
    def appended(self) -> list[Message]:
        """The messages the turn adds to the session before the reply."""
        return list(self.messages) if self.build else self.batch.tail


def plan_chat_turn(held: list[Message] | None, messages: list[Message], mode: Mode, *,
                   evicted: bool = False) -> TurnPlan:
    """The turn for a session whose engine holds ``held`` (None: it does not hold it; ``evicted``: its
    cache evicted it) and a request carrying ``messages``, every edit as ``mode``."""
    if held is None:
        reason: RebuildReason | None = None
        if evicted:
            reason = "evicted"
        elif any(m.role == "assistant" for m in messages):
            reason = "unknown_session"
        return TurnPlan(list(messages), build=True, built=True, rebuild_reason=reason)
    batch = plan_batch(held, messages, mode=mode)
    if batch.rebuild:
        return TurnPlan(list(messages), build=True, rebuild_reason="too_many_edits")
    return TurnPlan(list(messages), build=False, batch=batch)


@dataclass
class ChatTurn:
    """One finished chat turn: the generation, what it cost, what was done to the session.

    ``plan``: the bound turn's plan (None: a stateless request, which the bundled runtime
    answers from a throwaway session). ``start_version``: the session's version before the
    turn changed it (0 for a session the turn created from nothing). ``build_prefilled``:
    prompt tokens an engine computed building the session before the generation (the
    bundled runtime builds in a step of its own; vLLM builds in the generation's pass)."""

    response: GenerateResponse
    plan: TurnPlan | None = None
    start_version: int = 0
    outcomes: list[DirectiveOutcome] = field(default_factory=list)
    build_prefilled: int = 0
    applied_edits: list[AppliedEdit] = field(default_factory=list)  # context_management's

    @property
    def session_id(self) -> str | None:
        return self.response.session_id if self.plan is not None else None

    @property
    def versions(self) -> list[int]:
        """Every version the turn produced; consecutive, as no other request runs on the session meanwhile."""
        if self.plan is None:
            return []
        return list(range(self.start_version + 1, self.response.version + 1))

    @property
    def prefilled(self) -> int:
        """Prompt tokens computed for this request: building, by its directives, by the generation."""
        recomputed = sum(o.recomputed_tokens for o in self.outcomes)
        return self.build_prefilled + recomputed + self.response.usage.prefill_tokens

    @property
    def cached_tokens(self) -> int:
        return max(0, self.response.usage.prompt_tokens - self.prefilled)
