"""Leyline sessions on vLLM: message histories, versions, and the rows behind them.

A session is a message history (:class:`~.session.VllmSession`); its token ids come from the model's
chat template (:class:`~.template.ChatRenderer`). Its KV rows are one *snapshot*: the blocks of the last
prompt vLLM ran for it, held in vLLM's paged cache between turns (:mod:`leyline_vllm.kv.holds`; each
request releases the snapshot it supersedes). Every step that changes the history runs one prompt
through vLLM with a row plan (:mod:`.row_sync`).

A model whose cache the worker cannot splice (``refusal``: the connector's reason, see
:mod:`leyline_vllm.kv.rope` and :mod:`leyline_vllm.kv.layout`) is served all the same: prompts run
without row plans, vLLM's own prefix cache keeps what it can, and each ``amortize`` that would have
rotated rows is applied as ``forget`` with ``fallback_reason: "unsupported_runtime: <why>"``.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass

from leyline_runtime.api.chat_turn import ChatTurn, plan_chat_turn
from leyline_runtime.auto_rule import AutoConfig, DriftState
from leyline_sdk.diff import apply_directives
from leyline_sdk.errors import CapacityExceeded, ConflictError, SessionExists, SessionNotFound, ValidationFailed
from leyline_sdk.tools_prompt import parse_assistant
from leyline_sdk.protocol import (
    AppendResult,
    DirectiveBatch,
    DirectiveOutcome,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    Message,
    Mode,
    Segment,
    SessionCreate,
    SessionInfo,
    Usage,
    check_version,
)

from .auto_edits import AutoRule
from .edits import EditSpans, directive_outcomes, edit_spans, edited, replacement_bounds
from .metrics import ReplicaStats
from .row_sync import RowSync, Sync
from .sampling import token_logprobs, vllm_sampling
from .session import VllmSession
from .template import ChatRenderer

REBUILT_VERSION_RANGE = 2**31  # where a rebuilt session's versions start (see create)


@dataclass
class VllmTurn(ChatTurn):
    """A chat turn on vLLM, with the stop string that ended its reply (vLLM's ``stop_reason``; None: none
    did): the Messages API names the stop sequence, and vLLM's text leaves it out."""

    stop_string: str | None = None


class LeylineService:
    def __init__(self, engine_client, renderer: ChatRenderer, *, block_size: int, max_model_len: int,
                 model_name: str, refusal: str | None = None, auto: AutoRule | None = None,
                 refused_sampling: dict[str, str] | None = None):
        self.engine = engine_client
        self.refused_sampling = refused_sampling or {}  # sampling field -> why this server refuses it
        self.auto = auto or AutoRule(AutoConfig(), num_layers=0)  # mode auto's thresholds and the model's depth
        self.refusal = refusal  # why the worker does not splice this model's cache (None: it does)
        self.renderer = renderer
        self.max_model_len = max_model_len
        self.model_name = model_name
        self.sessions: dict[str, VllmSession] = {}
        self.stats = ReplicaStats()  # served on /metrics (leyline_vllm.api_server.metrics)
        self.rows = RowSync(engine_client, block_size=block_size, refusal=refusal, stats=self.stats)

    # -- sessions ---------------------------------------------------------------------------

    async def create(self, body: SessionCreate, rebuild_reason: str | None = None) -> SessionInfo:
        """``rebuild_reason``: the client rebuilds a session it had (the SDK's ``X-Leyline-Rebuild``)."""
        sid = body.session_id or f"sess_{uuid.uuid4().hex[:16]}"
        if sid in self.sessions:
            raise SessionExists(f"session {sid} already exists")
        session = VllmSession(sid, drift=DriftState(budget=self.auto.config.drift_budget))
        self.sessions[sid] = session
        self.stats.created += 1
        if rebuild_reason is not None:
            self.stats.rebuilt(rebuild_reason)
            # Another replica may still hold an older copy (a failover, a re-hash): this copy's versions
            # start at a random point, so no expected_version meant for one can match the other.
            session.version = secrets.randbelow(REBUILT_VERSION_RANGE)
        async with session.lock:
            try:
                if body.messages:
                    await self._append(session, body.messages)
            except BaseException:
                self.sessions.pop(sid, None)
                raise
            return self.info(session)

    def get(self, sid: str) -> VllmSession:
        session = self.sessions.get(sid)
        if session is None:
            self.stats.not_found += 1
            raise SessionNotFound(f"no session {sid}")
        return session

    def info(self, session: VllmSession, include_messages: bool = False) -> SessionInfo:
        bounds = self.renderer.segments(session.messages)
        segments = [Segment(index=i, message_id=m.id, role=m.role, start=a, end=b)
                    for i, (m, (a, b)) in enumerate(zip(session.messages, bounds))]
        return SessionInfo(session_id=session.session_id, version=session.version,
                           num_tokens=bounds[-1][1] if bounds else 0, num_messages=len(session.messages),
                           segments=segments, counters=session.counters.model_copy(),
                           messages=list(session.messages) if include_messages else None)

    async def delete(self, sid: str) -> None:
        session = self.get(sid)
        async with session.lock:
            if self.sessions.pop(sid, None) is not None:
                self.stats.retire(session.counters)
            if session.snapshot:
                self.rows.release_later([session.snapshot.key])

    async def append(self, sid: str, messages: list[Message], expected_version: int | None) -> AppendResult:
        session = self.get(sid)
        async with session.lock:
            check_version(session.session_id, session.version, expected_version)
            sync = await self._append(session, messages)
            n = sync.prompt_len
            return AppendResult(session_id=sid, version=session.version, num_tokens=n,
                                num_messages=len(session.messages),
                                usage=Usage(prompt_tokens=n, cached_tokens=n - sync.computed,
                                            prefill_tokens=sync.computed, total_tokens=n))

    async def generate(self, sid: str, body: GenerateRequest) -> GenerateResponse:
        session = self.get(sid)
        async with session.lock:
            check_version(session.session_id, session.version, body.expected_version)
            response, _, _ = await self._generate(session, body)
            return response

    async def apply(self, batch: DirectiveBatch) -> DirectiveResult:
        session = self.get(batch.session_id)
        async with session.lock:
            check_version(session.session_id, session.version, batch.expected_version)
            return await self._apply(session, batch)

    async def chat(self, sid: str, messages: list[Message], mode: Mode, sampling: GenerateRequest) -> VllmTurn:
        """A session-bound chat turn, planned by the rules every engine shares (:func:`plan_chat_turn`): a
        session this replica does not hold is built from the request, one it holds is edited (one batch)
        or, past the batch limit, built afresh; then the reply is generated.

        The edits and the generation run as one prompt through vLLM (two where an amortized
        replacement must be prefilled first): applying the batch on its own and then generating
        would load the whole history's rows a second time."""
        plan = None
        if sid not in self.sessions:
            plan = plan_chat_turn(None, messages, mode)
            await self.create(SessionCreate(session_id=sid), rebuild_reason=plan.rebuild_reason)
        session = self.get(sid)
        async with session.lock:
            start_version, batch = session.version, None
            plan = plan or plan_chat_turn(session.messages, messages, mode)
            if plan.rebuild_reason == "too_many_edits":  # the history starts afresh from the request
                await self._reset(session)
                self.stats.rebuilt(plan.rebuild_reason)
            elif not plan.build:
                # id-only edits render the same: new ids, no rows touched (as the SDK's shadow)
                session.messages = apply_directives(session.messages, plan.batch.local)
                if plan.directives:
                    batch = DirectiveBatch(session_id=sid, directives=plan.directives)
                    self.stats.directives += len(plan.directives)
            body = sampling.model_copy(update={"messages": plan.appended})
            response, sync, outcomes = await self._generate(session, body, edits=batch)
        stop = sync.last.stop_reason
        return VllmTurn(response, plan, start_version=start_version, outcomes=outcomes,
                        stop_string=stop if isinstance(stop, str) else None)

    async def _reset(self, session: VllmSession) -> None:
        """Empty the session (its saved rows dropped); the caller holds its lock."""
        if session.snapshot:
            self.rows.release_later([session.snapshot.key])
        session.snapshot, session.messages = None, []
        session.version += 1

    # -- the steps (callers hold the session's lock) ------------------------------------------

    async def _append(self, session: VllmSession, messages: list[Message]) -> Sync:
        history = session.messages + list(messages)
        ids = self._ids(history)
        sync = await self.rows.sync(session, ids)
        session.messages = history
        session.version += 1
        session.counters.prefilled_tokens += sync.computed
        session.counters.reused_tokens += sync.reused
        return sync

    async def _generate(self, session: VllmSession, body: GenerateRequest, edits: DirectiveBatch | None = None
                        ) -> tuple[GenerateResponse, Sync, list[DirectiveOutcome]]:
        """Generate after ``body.messages``; with ``edits``, the batch is applied first in the same pass
        (its own version, its outcomes returned)."""
        for field, reason in self.refused_sampling.items():
            if getattr(body, field) is not None:
                raise ValidationFailed(f"{field}: {reason}")
        base = session.messages if edits is None else edited(session.messages, edits)
        history = base + list(body.messages)
        # measured before anything runs: nothing may fail once vLLM has generated. One tokenization:
        # the prompt's ids and, with edits, where the edited history and each replacement end in them
        at = None if edits is None else [len(base), *replacement_bounds(edits)]
        ids, bounds = self._encode(history, generation_prompt=True, bounds_at=at)
        spans = self._edit_spans(session.messages, edits, bounds[1:]) if edits is not None else None
        if not ids:  # vLLM refuses an empty prompt; a chat template may render nothing for no messages
            raise ConflictError("the session has no messages and the chat template renders no prompt without "
                                "them: append a message first", code="empty_prompt")
        edited_len = bounds[0] if bounds else 0
        room = self.max_model_len - len(ids)
        if room < 1:
            raise CapacityExceeded(f"the prompt has {len(ids)} tokens; the model takes {self.max_model_len}")
        sampling = vllm_sampling(body, min(body.max_tokens, room))
        sync = await self.rows.sync(session, ids, runs=spans.runs if spans is not None else (), sampling=sampling,
                                    auto=self.auto if spans is not None and spans.auto else None,
                                    edit_start=spans.start if spans is not None else 0)
        result = sync.last
        generation_computed = sync.computed
        outcomes: list[DirectiveOutcome] = []
        if spans is not None:  # the edits recomputed every computed row before the appended messages
            generation_computed = min(result.computed, max(0, len(ids) - edited_len))
            outcomes = directive_outcomes(spans, sync, sync.computed - generation_computed)
            session.version += 1
            session.counters.reused_tokens += sync.reused
            session.counters.rotated_tokens += sync.rotated
            session.counters.recomputed_tokens += sync.computed - generation_computed
        message = parse_assistant(result.text, call_id_prefix=f"call_{session.session_id[-8:]}_{session.version}").message()
        session.messages = history + [message]
        session.version += 1
        session.counters.prefilled_tokens += generation_computed
        # as a generation after a separate edit would count it: the whole edited history was there
        session.counters.reused_tokens += edited_len if spans is not None else sync.reused
        finish = "tool_calls" if message.tool_calls else ("length" if result.finish_reason == "length" else "stop")
        n_out = len(result.token_ids)
        usage = Usage(prompt_tokens=len(ids), cached_tokens=len(ids) - generation_computed,
                      prefill_tokens=generation_computed, completion_tokens=n_out, total_tokens=len(ids) + n_out)
        response = GenerateResponse(session_id=session.session_id, message=message, finish_reason=finish,
                                    usage=usage, logprobs=token_logprobs(result, body.top_logprobs) if body.logprobs else None,
                                    version=session.version)
        return response, sync, outcomes

    async def _apply(self, session: VllmSession, batch: DirectiveBatch) -> DirectiveResult:
        started = time.perf_counter()
        new = edited(session.messages, batch)
        ids, bounds = self._encode(new, bounds_at=replacement_bounds(batch))
        spans = self._edit_spans(session.messages, batch, bounds)
        sync = await self.rows.sync(session, ids, runs=spans.runs, auto=self.auto if spans.auto else None,
                                    edit_start=spans.start)
        session.messages = new
        session.version += 1
        self.stats.directives += len(batch.directives)
        session.counters.reused_tokens += sync.reused
        session.counters.rotated_tokens += sync.rotated
        session.counters.recomputed_tokens += sync.computed
        return DirectiveResult(session_id=session.session_id, version=session.version, num_tokens=len(ids),
                               num_messages=len(new), outcomes=directive_outcomes(spans, sync, sync.computed),
                               elapsed_ms=(time.perf_counter() - started) * 1000)

    def _edit_spans(self, old: list[Message], batch: DirectiveBatch, new_bounds: list[int]) -> EditSpans:
        """``batch``'s spans in tokens, as its directives declared them: the old history's message
        bounds, and the edited one's ``new_bounds`` at :func:`.edits.replacement_bounds`."""
        return edit_spans(batch, self.renderer.segments(old), new_bounds)

    async def snapshot_rows(self, sid: str, layer: int, rank: int = 0) -> dict | None:
        """One layer of the session's saved rows (diagnostics): shape, dtype, float32 bytes, positions."""
        session = self.get(sid)
        async with session.lock:
            if session.snapshot is None:
                return None
            answers = await self.engine.collective_rpc("leyline_rows", args=(session.snapshot.key, layer))
            return answers[rank] if rank < len(answers) else None

    def _ids(self, messages: list[Message], generation_prompt: bool = False) -> list[int]:
        return self._encode(messages, generation_prompt)[0]

    def _encode(self, messages: list[Message], generation_prompt: bool = False,
                bounds_at: list[int] | None = None) -> tuple[list[int], list[int]]:
        ids, bounds = self.renderer.encode(messages, generation_prompt=generation_prompt, bounds_at=bounds_at or ())
        if len(ids) > self.max_model_len:
            raise CapacityExceeded(f"the history has {len(ids)} tokens; the model takes {self.max_model_len}")
        return ids, bounds
