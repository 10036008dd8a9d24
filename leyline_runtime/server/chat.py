"""Chat completions against the runtime: stateless, or bound to a session.

A bound request carries the whole history, as OpenAI clients do. The
service plans the batch against the session's messages
(:func:`leyline_sdk.batch_plan.plan_batch`, the planner the SDK and the vLLM
service use too), applies the edits as one directive batch, appends the new
tail and generates. An append-only request therefore reuses the whole cache; a
request for a session that does not exist (new, or evicted) builds it from
the history it carries.

Chat requests for one session are serialised by a per-session lock, so
they never interleave. The steps are separate runtime calls chained by
``expected_version``; if a native request (``/directives``, ``/generate``)
slips in between, the chain restarts from a fresh diff (before any token
was produced, so nothing is generated twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from leyline_sdk.batch_plan import BatchPlan, plan_batch
from leyline_sdk.errors import SessionExists, SessionNotFound, VersionConflict
from leyline_sdk.protocol import (
    DirectiveBatch,
    DirectiveOutcome,
    GenerateResponse,
    Message,
    SessionCreate,
)

from leyline_runtime.engine.grammar import GrammarCompiler
from ..metrics import ServiceMetrics
from ..runtime import Runtime
from .constraints import Decoding, plan_decoding
from .context_edits import apply_edits
from .openai_schema import AppliedEdit, ChatCompletionRequest
from .prompt import generate_request, prompt_messages

MAX_ATTEMPTS = 3

OnToken = Callable[[int], None]


@dataclass
class ChatTurn:
    """One completed chat request: the generation and what it cost."""

    response: GenerateResponse
    session_id: str | None  # None: stateless
    prefilled: int  # prompt tokens computed for this request
    rebuilt: bool = False
    directives_applied: int = 0
    outcomes: list[DirectiveOutcome] = field(default_factory=list)
    appended: int = 0
    applied_edits: list[AppliedEdit] = field(default_factory=list)
    first_version: int = 0  # the session's version before this turn (bound turns)

    @property
    def versions(self) -> list[int]:
        """Every version the turn produced; consecutive, as no other request runs on the session meanwhile."""
        if self.session_id is None:
            return []
        return list(range(self.first_version + 1, self.response.version + 1))

    @property
    def cached_tokens(self) -> int:
        return max(0, self.response.usage.prompt_tokens - self.prefilled)


class _Restart(Exception):
    """Another request changed the session between two steps; diff again."""


class ChatService:
    def __init__(self, runtime: Runtime, metrics: ServiceMetrics):
        self.runtime = runtime
        self.metrics = metrics
        self.session_locks = runtime.session_locks  # the runtime's own: one lock per session
        self.grammars = GrammarCompiler(runtime.tokenizer)

    def complete(self, request: ChatCompletionRequest, tenant: str, session_id: str | None = None,
                 on_token: OnToken | None = None) -> ChatTurn:
        """Run one chat request to the end (``on_token`` sees tokens as they come)."""
        decoding = plan_decoding(request, self.runtime.tokenizer, self.grammars)
        messages, edits = apply_edits(request.context_management, prompt_messages(request), self.runtime.tokenizer)
        started = False

        def watch(token: int) -> None:
            nonlocal started
            started = True
            if on_token is not None:
                on_token(token)

        for attempt in range(MAX_ATTEMPTS):
            try:
                if session_id is None:
                    turn = self._stateless(request, decoding, messages, tenant, watch)
                else:
                    with self.session_locks.hold((tenant, session_id)):
                        turn = self._bound(request, decoding, messages, session_id, tenant, watch)
                break
            except (_Restart, VersionConflict, SessionNotFound) as exc:
                if started or attempt == MAX_ATTEMPTS - 1:
                    if isinstance(exc, _Restart):
                        raise VersionConflict(f"session {session_id} kept changing under this request") from exc
                    raise
        turn.applied_edits = edits
        gen = turn.response
        self.metrics.observe_generation("chat_completions", gen.finish_reason, gen.usage.completion_tokens,
                                        tenant)
        return turn

    # -- the two kinds of request --------------------------------------------------------

    def _stateless(self, request: ChatCompletionRequest, decoding: Decoding, messages: list[Message],
                   tenant: str, on_token: OnToken) -> ChatTurn:
        sid = f"chat_{uuid.uuid4().hex}"
        info = self.runtime.create_session(SessionCreate(session_id=sid, messages=messages), tenant)
        try:
            gen = self.runtime.generate(sid, generate_request(request), tenant, on_token=on_token,
                                        processors=decoding.processors(self.grammars, generate_request(request).max_tokens))
        finally:
            with suppress(SessionNotFound):
                self.runtime.delete_session(sid, tenant)
        return ChatTurn(gen, None, info.counters.prefilled_tokens + gen.usage.prefill_tokens)

    def _bound(self, request: ChatCompletionRequest, decoding: Decoding, messages: list[Message], sid: str,
               tenant: str, on_token: OnToken) -> ChatTurn:
        try:
            old, version = self.runtime.session_messages(sid, tenant)
        except SessionNotFound:  # a new session is built, not rebuilt; an evicted one is rebuilt
            return self._rebuild(request, decoding, messages, sid, tenant, on_token,
                                 rebuilt=self.runtime.was_evicted(sid, tenant))
        first_version = version
        plan = plan_chat_batch(old, messages, request)
        directives, tail = plan.directives, plan.tail
        self.runtime.relabel(sid, tenant, plan.local)
        if plan.rebuild:
            prompt = sum(map(len, self.runtime.tokenizer.encode_messages(messages)))
            self.runtime.check_generation(prompt, generate_request(request).max_tokens, new_tokens=prompt)
            with suppress(SessionNotFound):
                self.runtime.delete_session(sid, tenant)
            return self._rebuild(request, decoding, messages, sid, tenant, on_token, rebuilt=True)
        outcomes: list[DirectiveOutcome] = []
        if directives:  # check the whole request before the edits change the session
            tail_tokens = sum(map(len, self.runtime.tokenizer.encode_messages(tail)))
            self.runtime.check_generation(self.runtime.edited_length(sid, tenant, directives) + tail_tokens,
                                          generate_request(request).max_tokens, new_tokens=tail_tokens)
            batch = DirectiveBatch(session_id=sid, directives=directives, expected_version=version)
            result = self.runtime.apply(batch, tenant)
            self.metrics.observe_directives(result, tenant)
            version, outcomes = result.version, result.outcomes
        gen = self.runtime.generate(sid, generate_request(request, messages=tail, expected_version=version),
                                    tenant, on_token=on_token,
                                    processors=decoding.processors(self.grammars, generate_request(request).max_tokens))
        recomputed = sum(o.recomputed_tokens for o in outcomes)
        return ChatTurn(gen, sid, recomputed + gen.usage.prefill_tokens, directives_applied=len(directives),
                        outcomes=outcomes, appended=len(tail), first_version=first_version)

    def _rebuild(self, request: ChatCompletionRequest, decoding: Decoding, messages: list[Message], sid: str,
                 tenant: str, on_token: OnToken, rebuilt: bool) -> ChatTurn:
        """Build the session from the request's history (``rebuilt``: it existed before)."""
        try:
            info = self.runtime.create_session(SessionCreate(session_id=sid, messages=messages), tenant)
        except SessionExists as exc:  # created by a concurrent request
            raise _Restart() from exc
        try:
            gen = self.runtime.generate(sid, generate_request(request, expected_version=info.version), tenant,
                                        on_token=on_token,
                                        processors=decoding.processors(self.grammars, generate_request(request).max_tokens))
        except BaseException:
            with suppress(SessionNotFound):  # it did not exist before this request
                self.runtime.delete_session(sid, tenant)
            raise
        return ChatTurn(gen, sid, info.counters.prefilled_tokens + gen.usage.prefill_tokens, rebuilt=rebuilt,
                        appended=len(messages))


def plan_chat_batch(old: list[Message], messages: list[Message], request: ChatCompletionRequest) -> BatchPlan:
    """The directive batch a bound chat request sends (the SDK's and the vLLM service's planner).

    Id-only edits (``plan.local``) are not sent as directives: the route gives
    the session's messages their new ids (:meth:`Runtime.relabel`), as the SDK
    renames them in its shadow, so the next diff aligns the same way."""
    return plan_batch(old, messages, mode=request.leyline.mode if request.leyline else "amortize")
