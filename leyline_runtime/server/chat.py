"""Chat completions on the bundled runtime: stateless, or a session-bound turn.

A bound turn is planned by the rules every engine shares
(:func:`leyline_runtime.api.chat_turn.plan_chat_turn`: build, rebuild or edit, and why);
this service runs the plan on the runtime: the edits as one directive batch, then the new
tail appended and the reply generated. An append-only request therefore reuses the whole
cache. A stateless request runs in a throwaway session.

Chat requests for one session are serialised by a per-session lock, so
they never interleave. The steps are separate runtime calls chained by
``expected_version``; if a native request (``/directives``, ``/generate``)
slips in between, the chain restarts from a fresh plan (before any token
was produced, so nothing is generated twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import suppress

from leyline_sdk.errors import SessionExists, SessionNotFound, VersionConflict
from leyline_sdk.protocol import (
    DirectiveBatch,
    DirectiveOutcome,
    Message,
    SessionCreate,
)

from leyline_runtime.engine.grammar import GrammarCompiler
from ..api.chat_prompt import generate_request, prompt_messages
from ..api.chat_request import ChatCompletionRequest
from ..api.chat_turn import ChatTurn, TurnPlan, plan_chat_turn
from ..metrics import ServiceMetrics
from ..runtime import Runtime
from .constraints import Decoding, plan_decoding
from ..api.context_edits import apply_edits

MAX_ATTEMPTS = 3

OnToken = Callable[[int], None]


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
                                        processors=decoding.processors(self.grammars, request.effective_max_tokens))
        finally:
            with suppress(SessionNotFound):
                self.runtime.delete_session(sid, tenant)
        return ChatTurn(gen, build_prefilled=info.counters.prefilled_tokens)

    def _bound(self, request: ChatCompletionRequest, decoding: Decoding, messages: list[Message], sid: str,
               tenant: str, on_token: OnToken) -> ChatTurn:
        try:
            held, version = self.runtime.session_messages(sid, tenant)
        except SessionNotFound:
            held, version = None, 0
        evicted = held is None and self.runtime.was_evicted(sid, tenant)
        plan = plan_chat_turn(held, messages, request.edit_mode, evicted=evicted)
        max_tokens = request.effective_max_tokens
        if plan.build:
            if held is not None:  # too many edits: check the request before dropping what the session holds
                prompt = sum(map(len, self.runtime.tokenizer.encode_messages(messages)))
                self.runtime.check_generation(prompt, max_tokens, new_tokens=prompt)
                with suppress(SessionNotFound):
                    self.runtime.delete_session(sid, tenant)
            return self._build(request, decoding, plan, sid, tenant, on_token)
        self.runtime.relabel(sid, tenant, plan.batch.local)
        outcomes: list[DirectiveOutcome] = []
        version_now = version
        if plan.directives:  # check the whole request before the edits change the session
            tail_tokens = sum(map(len, self.runtime.tokenizer.encode_messages(plan.appended)))
            self.runtime.check_generation(self.runtime.edited_length(sid, tenant, plan.directives) + tail_tokens,
                                          max_tokens, new_tokens=tail_tokens)
            batch = DirectiveBatch(session_id=sid, directives=plan.directives, expected_version=version)
            result = self.runtime.apply(batch, tenant)
            self.metrics.observe_directives(result, tenant)
            version_now, outcomes = result.version, result.outcomes
        sampling = generate_request(request, messages=plan.appended, expected_version=version_now)
        gen = self.runtime.generate(sid, sampling, tenant, on_token=on_token,
                                    processors=decoding.processors(self.grammars, max_tokens))
        return ChatTurn(gen, plan, start_version=version, outcomes=outcomes)

    def _build(self, request: ChatCompletionRequest, decoding: Decoding, plan: TurnPlan, sid: str, tenant: str,
               on_token: OnToken) -> ChatTurn:
        """Build the session from the request's history, then generate."""
        try:
            info = self.runtime.create_session(SessionCreate(session_id=sid, messages=plan.messages), tenant)
        except SessionExists as exc:  # created by a concurrent request
            raise _Restart() from exc
        try:
            gen = self.runtime.generate(sid, generate_request(request, expected_version=info.version), tenant,
                                        on_token=on_token,
                                        processors=decoding.processors(self.grammars, request.effective_max_tokens))
        except BaseException:
            with suppress(SessionNotFound):  # it did not exist before this request
                self.runtime.delete_session(sid, tenant)
            raise
        return ChatTurn(gen, plan, build_prefilled=info.counters.prefilled_tokens)
