"""Leyline sessions on vLLM: message histories, versions, and the rows behind them.

A session is a message history; its token ids come from the model's chat template
(:class:`ChatRenderer`). Its KV rows are one *snapshot*: the blocks of the last prompt vLLM ran for
it, held in vLLM's paged cache between turns (:mod:`leyline_vllm.holds`; each request releases the
snapshot it supersedes). Every step that changes the history runs one prompt through vLLM with a row
plan (:func:`leyline_vllm.plan.plan_turn`): the unchanged prefix is loaded, for ``amortize`` the
longest run after the edit is loaded with its rope part rotated (its replacement is prefilled first),
everything else is computed by vLLM.
Exact rows are shared, approximate rows private (the rule of vLLM RFC #44223):
a request whose prompt carries approximate rows (rotated rows, and everything
computed after them: :attr:`Snapshot.exact`) runs with the session's own
``cache_salt``, so vLLM's prefix cache never hands those blocks to another
request; every other request is exact and unsalted, so a system prompt and
tool definitions that many sessions share are computed once, as in plain vLLM.

A model whose cache the worker cannot splice (``refusal``: the connector's
reason, see :mod:`leyline_vllm.rope` and :mod:`leyline_vllm.layout`) is served
all the same: prompts run without row plans, vLLM's own prefix cache keeps what
it can, and each ``amortize`` that would have rotated rows is applied as
``forget`` with ``fallback_reason: "unsupported_runtime: <why>"``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from dataclasses import dataclass, field

from leyline_sdk.batch_plan import BatchPlan, plan_batch
from leyline_sdk.diff import apply_directives
from leyline_sdk.errors import CapacityExceeded, InvalidDirective, SessionExists, SessionNotFound
from leyline_sdk.tools_prompt import parse_assistant
from leyline_sdk.protocol import (
    AppendResult, AutoDecision, Directive, DirectiveBatch, DirectiveOutcome, DirectiveResult,
    GenerateRequest, GenerateResponse, Message, Mode, Segment, SessionCounters, SessionCreate, SessionInfo,
    TokenLogprob, TopLogprob, Usage, check_version,
)

from .engine import EngineResult, run_prompt
from .metrics import ReplicaStats
from .plan import RowCopy, Snapshot, TurnPlan, plan_turn
from .request_params import request_params
from .template import ChatRenderer

ONE_TOKEN = {"max_tokens": 1, "temperature": 0.0}
# mode "auto" decides per edit from the layer-1 drift signal the bundled runtime reads from its own cache;
# the plugin has no such read of vLLM's paged cache, so it takes the exact choice and says so
AUTO_UNSUPPORTED = ("unsupported_runtime: mode auto needs the drift signal only the bundled runtime measures; "
                    "applied as forget")
REBUILT_VERSION_RANGE = 2**31  # where a rebuilt session's versions start (see create)


@dataclass
class VllmSession:
    session_id: str
    messages: list[Message] = field(default_factory=list)
    version: int = 0
    salt: str = field(default_factory=lambda: secrets.token_hex(16))
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    snapshot: Snapshot | None = None
    counters: SessionCounters = field(default_factory=SessionCounters)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _keys: int = 0

    def new_key(self) -> str:
        self._keys += 1
        return f"{self.uid}:{self._keys}"


@dataclass
class ChatTurn:
    response: GenerateResponse
    outcomes: list[DirectiveOutcome]
    appended: int
    rebuilt: bool
    # why the session was (re)built from the request: "unknown_session" (this replica did not hold a
    # session whose history already has replies: a restart, a re-hash), "too_many_edits"; None otherwise
    rebuild_reason: str | None = None
    built: bool = False  # this replica did not hold the session: it was built from the request

    @property
    def prefilled(self) -> int:
        """Prompt tokens computed for this request: by its directives and by the generation."""
        return sum(o.recomputed_tokens for o in self.outcomes) + self.response.usage.prefill_tokens


@dataclass
class Sync:
    """What one history change cost: the engine results and the row accounting."""

    results: list[EngineResult]
    plan: TurnPlan
    reused: int = 0
    rotated: int = 0
    computed: int = 0
    fallback: str | None = None

    @property
    def last(self) -> EngineResult:
        return self.results[-1]


class LeylineService:
    def __init__(self, engine_client, renderer: ChatRenderer, *, block_size: int, max_model_len: int,
                 model_name: str, refusal: str | None = None):
        self.engine = engine_client
        self.refusal = refusal  # why the worker does not splice this model's cache (None: it does)
        self.renderer = renderer
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.model_name = model_name
        self.sessions: dict[str, VllmSession] = {}
        self.stats = ReplicaStats()  # served on /metrics (leyline_vllm.metrics)
        # released with the next request: requests are the way to the scheduler, which holds the blocks
        self._pending_release: list[str] = []

    # -- sessions ---------------------------------------------------------------------------

    async def create(self, body: SessionCreate, rebuild_reason: str | None = None) -> SessionInfo:
        """``rebuild_reason``: the client rebuilds a session it had (the SDK's ``X-Leyline-Rebuild``)."""
        sid = body.session_id or f"sess_{uuid.uuid4().hex[:16]}"
        if sid in self.sessions:
            raise SessionExists(f"session {sid} already exists")
        session = VllmSession(sid)
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
                self._release_later([session.snapshot.key])

    async def append(self, sid: str, messages: list[Message], expected_version: int | None) -> AppendResult:
        session = self.get(sid)
        async with session.lock:
            check_version(session.session_id, session.version, expected_version)
            sync = await self._append(session, messages)
            n = sync.last.prompt_len
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

    async def chat(self, sid: str, messages: list[Message], mode: Mode, sampling: GenerateRequest) -> ChatTurn:
        """A session-bound chat request: diff the history against the session's, apply the edits as one
        batch, generate. A session that does not exist is built from the request.

        The edits and the generation run as one prompt through vLLM (two where an amortized
        replacement must be prefilled first): applying the batch on its own and then generating
        would load the whole history's rows a second time."""
        created, rebuilt, reason = sid not in self.sessions, False, None
        if created:
            # Built from the request. A history that already holds a reply was served elsewhere (another
            # replica, this one before a restart): a rebuild, named. Without one it is a new session.
            rebuilt = any(m.role == "assistant" for m in messages)
            reason = "unknown_session" if rebuilt else None
            await self.create(SessionCreate(session_id=sid), rebuild_reason=reason)
        session = self.get(sid)
        async with session.lock:
            batch, tail = None, list(messages)
            if not created:
                plan = plan_chat_batch(session.messages, messages, mode)
                if plan.rebuild:  # too many edits for one batch: the history starts afresh from the request
                    await self._reset(session)
                    rebuilt, reason = True, "too_many_edits"
                    self.stats.rebuilt(reason)
                else:
                    tail = plan.tail
                    # id-only edits render the same: new ids, no rows touched (as the SDK's shadow)
                    session.messages = apply_directives(session.messages, plan.local)
                    if plan.directives:
                        batch = DirectiveBatch(session_id=sid, directives=plan.directives)
                        self.stats.directives += len(plan.directives)
            body = sampling.model_copy(update={"messages": tail})
            response, _, outcomes = await self._generate(session, body, edits=batch)
        return ChatTurn(response, outcomes, len(tail), rebuilt, reason, created)

    async def _reset(self, session: VllmSession) -> None:
        """Empty the session (its saved rows dropped); the caller holds its lock."""
        if session.snapshot:
            self._release_later([session.snapshot.key])
        session.snapshot, session.messages = None, []
        session.version += 1

    # -- the steps (callers hold the session's lock) ------------------------------------------

    async def _append(self, session: VllmSession, messages: list[Message]) -> Sync:
        history = session.messages + list(messages)
        ids = self._ids(history)
        sync = await self._sync(session, ids, rotate=False)
        session.messages = history
        session.version += 1
        session.counters.prefilled_tokens += sync.computed
        session.counters.reused_tokens += sync.reused
        return sync

    async def _generate(self, session: VllmSession, body: GenerateRequest, edits: DirectiveBatch | None = None
                        ) -> tuple[GenerateResponse, Sync, list[DirectiveOutcome]]:
        """Generate after ``body.messages``; with ``edits``, the batch is applied first in the same pass
        (its own version, its outcomes returned)."""
        base = session.messages if edits is None else _edited(session.messages, edits)
        history = base + list(body.messages)
        # measured before anything runs: nothing may fail once vLLM has generated
        spans = self._edit_spans(session.messages, edits) if edits is not None else None
        # one tokenization: the prompt's ids and, with edits, where the edited history ends in them
        # (and where the first message after a single edit starts)
        at = None if spans is None else [len(base)] + ([spans.after] if spans.after is not None else [])
        ids, bounds = self._encode(history, generation_prompt=True, bounds_at=at)
        edited_len = bounds[0] if bounds else 0
        room = self.max_model_len - len(ids)
        if room < 1:
            raise CapacityExceeded(f"the prompt has {len(ids)} tokens; the model takes {self.max_model_len}")
        sampling = _sampling(body, min(body.max_tokens, room))
        sync = await self._sync(session, ids, rotate=spans is not None and spans.rotate, sampling=sampling,
                                moved=spans.moved(bounds[1:]) if spans is not None else None)
        result = sync.last
        generation_computed = sync.computed
        outcomes: list[DirectiveOutcome] = []
        if spans is not None:  # the edits recomputed every computed row before the appended messages
            generation_computed = min(result.computed, max(0, len(ids) - edited_len))
            outcomes = _outcomes(spans, sync, sync.computed - generation_computed)
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
                                    usage=usage, logprobs=_logprobs(result, body.top_logprobs) if body.logprobs else None,
                                    version=session.version)
        return response, sync, outcomes

    async def _apply(self, session: VllmSession, batch: DirectiveBatch) -> DirectiveResult:
        started = time.perf_counter()
        new = _edited(session.messages, batch)
        spans = self._edit_spans(session.messages, batch)
        ids, bounds = self._encode(new, bounds_at=[spans.after] if spans.after is not None else None)
        sync = await self._sync(session, ids, rotate=spans.rotate, moved=spans.moved(bounds))
        session.messages = new
        session.version += 1
        self.stats.directives += len(batch.directives)
        session.counters.reused_tokens += sync.reused
        session.counters.rotated_tokens += sync.rotated
        session.counters.recomputed_tokens += sync.computed
        return DirectiveResult(session_id=session.session_id, version=session.version, num_tokens=len(ids),
                               num_messages=len(new), outcomes=_outcomes(spans, sync, sync.computed),
                               elapsed_ms=(time.perf_counter() - started) * 1000)

    def _edit_spans(self, old: list[Message], batch: DirectiveBatch) -> EditSpans:
        bounds = self.renderer.segments(old)
        old_len = bounds[-1][1] if bounds else 0
        spans = []
        for d in sorted(batch.directives, key=lambda d: (d.span.start, d.span.end)):
            start = bounds[d.span.start][0] if d.span.start < len(old) else old_len
            end = bounds[d.span.end - 1][1] if d.span.end > d.span.start else start
            spans.append((d, start, end, len(self._ids(list(d.replacement))) if d.replacement else 0))
        return EditSpans(spans, old_len, all(d.mode == "amortize" for d in batch.directives))

    # -- rows --------------------------------------------------------------------------------

    async def _sync(self, session: VllmSession, ids: list[int], *, rotate: bool,
                    sampling: dict | None = None, moved: tuple[int, int] | None = None) -> Sync:
        """Run ``ids`` through vLLM with the session's row plan; the session's snapshot becomes ``ids``."""
        if self.refusal is not None:
            return await self._sync_unspliced(session, ids, sampling)
        plan = plan_turn(session.snapshot, ids, rotate=rotate, min_rotated=self.block_size, moved=moved)
        old = session.snapshot
        # rows loaded from the snapshot past its exact part are approximate: such a request is salted
        prefix_exact = plan.prefix <= (old.exact_tokens if old else 0)
        results, scratch = [], []
        load: list[RowCopy] = list(plan.first)
        if plan.rotated is not None and plan.prefill_upto > plan.prefix:
            # the replacement sits before the rotated rows: prefill it (after the prefix) first
            key = session.new_key()
            results.append(await self._run(session, ids[:plan.prefill_upto], plan.first, key, ONE_TOKEN,
                                           salted=not prefix_exact))
            scratch.append(key)
            load = [RowCopy(key, 0, 0, plan.prefill_upto)] if results[0].report.saved == key else []
        rotating = plan.rotated is not None and (not results or bool(load))
        if rotating:
            load.append(plan.rotated)
        key = session.new_key()
        approximate = rotating or (bool(load) and not prefix_exact)
        superseded = scratch + ([old.key] if old else [])  # released once this request is done with them
        results.append(await self._run(session, ids, load, key, sampling or ONE_TOKEN, salted=approximate,
                                       release=superseded))
        last = results[-1]
        if last.report.saved == key:  # the prompt's rows, and those of the tokens it generated
            exact = None  # all of them: nothing approximate was loaded, or a failed load was recomputed
            if approximate and last.report.fallback is None:
                exact = plan.prefill_upto if rotating and prefix_exact else old.exact_tokens
            session.snapshot = Snapshot(key, (list(ids) + last.token_ids)[:last.report.saved_tokens], exact)
        else:
            session.snapshot = None
        return _account(plan, results)

    async def _sync_unspliced(self, session: VllmSession, ids: list[int], sampling: dict | None) -> Sync:
        """``ids`` through vLLM without a row plan (the model is not spliced): nothing rotates, so every
        row is exact and the request unsalted; vLLM's own prefix cache supplies what it holds."""
        result = await run_prompt(self.engine, ids, sampling or ONE_TOKEN, {}, None)
        return Sync([result], TurnPlan(prefix=0, reason=f"unsupported_runtime: {self.refusal}"),
                    reused=result.prompt_len - result.computed, computed=result.computed)

    async def _run(self, session: VllmSession, ids: list[int], load: list[RowCopy], save: str,
                   sampling: dict, *, salted: bool, release: list[str] = ()) -> EngineResult:
        """One request; ``salted`` where it loads approximate rows, so that the blocks vLLM's prefix cache
        keeps of it (rotated rows and everything computed after them) answer only this session. It
        releases ``release`` (and whatever waits to be released) when it is done."""
        pending, self._pending_release = self._pending_release, []
        params = request_params(session.session_id, load, save, [*pending, *release])
        try:
            result = await run_prompt(self.engine, ids, sampling, params, session.salt if salted else None)
        except BaseException:  # it may never have reached the scheduler (a scratch key: the TTL takes it)
            self._release_later([*pending, save])
            raise
        self.stats.observe(result.report)
        return result

    def _release_later(self, keys: list[str]) -> None:
        """Release ``keys`` with the next request (or by TTL or pressure if none comes)."""
        self._pending_release.extend(keys)

    async def snapshot_rows(self, sid: str, layer: int) -> dict | None:
        """One layer of the session's saved rows (diagnostics): shape, dtype, float32 bytes, positions."""
        session = self.get(sid)
        async with session.lock:
            if session.snapshot is None:
                return None
            return (await self.engine.collective_rpc("leyline_rows", args=(session.snapshot.key, layer)))[0]

    def _ids(self, messages: list[Message], generation_prompt: bool = False) -> list[int]:
        return self._encode(messages, generation_prompt)[0]

    def _encode(self, messages: list[Message], generation_prompt: bool = False,
                bounds_at: list[int] | None = None) -> tuple[list[int], list[int]]:
        ids, bounds = self.renderer.encode(messages, generation_prompt=generation_prompt, bounds_at=bounds_at or ())
        if len(ids) > self.max_model_len:
            raise CapacityExceeded(f"the history has {len(ids)} tokens; the model takes {self.max_model_len}")
        return ids, bounds


def plan_chat_batch(old: list[Message], messages: list[Message], mode: Mode) -> BatchPlan:
    """The directive batch a session-bound chat request sends (the SDK's and the bundled runtime's planner)."""
    return plan_batch(old, messages, mode=mode)


def _account(plan: TurnPlan, results: list[EngineResult]) -> Sync:
    sync = Sync(results, plan)
    fallbacks = [r.report.fallback for r in results if r.report.fallback]
    sync.fallback = fallbacks[0] if fallbacks else None
    sync.computed = sum(r.computed for r in results)
    last = results[-1]
    reached = last.prompt_len - last.computed  # rows the last request did not compute
    if plan.rotated is not None and last.report.fallback is None:
        sync.rotated = max(0, min(reached, plan.rotated.dst_end) - plan.rotated.dst_start)
    if len(results) == 2:
        sync.reused = results[0].prompt_len - results[0].computed
    else:  # the kept prefix, and whatever vLLM's own prefix cache held (a system prompt other sessions share)
        sync.reused = max(0, reached - sync.rotated)
    return sync


@dataclass
class EditSpans:
    """A directive batch measured against the history it edits: per directive (sorted by span) its
    old token range and its replacement's length."""

    spans: list[tuple[Directive, int, int, int]]  # directive, old start, old end, replacement tokens
    old_len: int
    rotate: bool  # every directive amortizes: the rows after the edits move

    @property
    def after(self) -> int | None:
        """Index, in the edited history, of the first message after a single edit (None: several)."""
        if len(self.spans) != 1:
            return None
        d = self.spans[0][0]
        return d.span.start + len(d.replacement)

    def moved(self, bounds: list[int]) -> tuple[int, int] | None:
        """(old, new) token position of the first token after a single edit — a hint for the row plan;
        ``bounds``: the edited history's token bounds asked for at :attr:`after` (last)."""
        return (self.spans[0][2], bounds[-1]) if self.after is not None and bounds else None


def _outcomes(edits: EditSpans, sync: Sync, recomputed: int) -> list[DirectiveOutcome]:
    """Per directive what was applied; the batch ran as one plan, so its row counts sit on the first."""
    outcomes = []
    for i, (d, start, end, new_len) in enumerate(edits.spans):
        applied, reason, auto = d.mode, None, None
        if sync.fallback:  # saved rows could not be loaded: vLLM recomputed them (a full prefill)
            applied, reason = "forget", sync.fallback
        elif d.mode == "auto":  # the batch ran without rotation (EditSpans.rotate is False)
            applied, reason = "forget", AUTO_UNSUPPORTED
            auto = AutoDecision(choice="forget", reason="unsupported_runtime")
        elif d.mode == "amortize" and end < edits.old_len:  # something follows the span: it had to rotate
            if not edits.rotate:
                applied, reason = "forget", "a forget in the same batch recomputes what follows it"
            elif sync.plan.rotated is None:
                applied, reason = "forget", sync.plan.reason or "nothing after the edit to rotate"
        totals = i == 0
        outcomes.append(DirectiveOutcome(
            requested_mode=d.mode, applied_mode=applied, fallback_reason=reason, token_start=start,
            token_end=end, delta=new_len - (end - start),
            reused_tokens=sync.reused if totals else 0, rotated_tokens=sync.rotated if totals else 0,
            recomputed_tokens=recomputed if totals else 0, auto=auto))
    return outcomes


def _edited(messages: list[Message], batch: DirectiveBatch) -> list[Message]:
    """The history after ``batch``; a bad batch raises a 4xx error and changes nothing."""
    for i, d in enumerate(batch.directives):
        if d.span.unit != "message":
            raise InvalidDirective(f"directive {i}: token spans are not supported on vLLM; use message spans")
    return apply_directives(messages, batch.directives)  # validates spans, overlaps


def _sampling(body: GenerateRequest, max_tokens: int) -> dict:
    out = {"max_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p,
           "top_k": body.top_k or 0, "seed": body.seed, "stop": body.stop_strings() or None,
           "min_tokens": min(body.min_tokens, max_tokens)}
    if body.logprobs:
        out["logprobs"] = max(1, body.top_logprobs)
    return out


def _logprobs(result: EngineResult, top_k: int) -> list[TokenLogprob]:
    out = []
    for token_id, options in zip(result.token_ids, result.logprobs or []):
        chosen = options[token_id]
        ranked = sorted(options.values(), key=lambda lp: lp.rank)
        top = [TopLogprob(token=lp.decoded_token or "", logprob=lp.logprob,
                          bytes=list((lp.decoded_token or "").encode())) for lp in ranked[:top_k]]
        out.append(TokenLogprob(token=chosen.decoded_token or "", logprob=chosen.logprob,
                                bytes=list((chosen.decoded_token or "").encode()), top_logprobs=top))
    return out
