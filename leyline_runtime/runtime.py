"""The runtime: model, tokenizer, paged cache, sessions, directive executor.

This is the one object the HTTP layer and the CLI drive; benches and tests
reach its sessions through it and :mod:`.inspection`, never through its
private state (the inspector too: it is built on ``hold``, ``room``, ``prefill_messages``,
``fork_session`` and ``recompute``). Every public method takes the caller's tenant: sessions live in a
per-tenant namespace, so a tenant can never name another tenant's session.
Work on one session (appends, directive batches, generation) is serialised
by that session's lock; different sessions never wait for each other, and
their model work meets in the engine's batched steps. One short lock guards
the session map, eviction and commits, never model work. The HTTP layer
calls these methods from worker threads, off the event loop.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from leyline_sdk.diff import apply_directives
from leyline_sdk.errors import SessionExists, SessionNotFound
from leyline_sdk.protocol import (
    AppendResult,
    Directive,
    DirectiveBatch,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    Message,
    SessionCreate,
    SessionInfo,
    Usage,
    check_version,
)

from leyline_runtime.admission import Admission
from leyline_runtime.cache_room import CacheRoom
from leyline_runtime.config import RuntimeConfig
from leyline_runtime.directives.auto_mode import AutoDecider
from leyline_runtime.auto_rule import DriftState
from leyline_runtime.engine.engine import Engine, Generation
from leyline_runtime.directives.executor import DirectiveExecutor
from leyline_runtime.engine.grammar import GrammarProcessor
from leyline_runtime.engine.kv_cache import BlockPool, BlockTable
from .model import DeepseekForCausalLM, load_model
from .model.default import DEFAULT_MODEL_DIR
from leyline_runtime.engine.sampling import LogitsProcessor
from leyline_runtime.sessions.locks import KeyedLocks
from leyline_runtime.sessions.session import Session
from leyline_runtime.sessions.tenancy import RuntimeStats, Tenancy
from leyline_runtime.text.replies import content_logprobs, reply_message
from leyline_runtime.text.tokenizer import ChatTokenizer

DEFAULT_TENANT = "default"


class Runtime:
    def __init__(self, config: RuntimeConfig | None = None, *, model: DeepseekForCausalLM | None = None,
                 tokenizer: ChatTokenizer | None = None):
        self.config = config = config or RuntimeConfig()
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        self.model = model if model is not None else load_model(config.model_path, device=config.device, dtype=dtype)
        folder = Path(config.model_path) if config.model_path else DEFAULT_MODEL_DIR
        self.tokenizer = tokenizer or ChatTokenizer.from_file(folder / "tokenizer.json")
        num_blocks = max(1, -(-config.max_cache_tokens // config.block_size))
        self.pool = BlockPool(self.model.cache_layout(), num_blocks, config.block_size,
                              dtype=self.model.dtype, device=config.device)
        self.engine = Engine(self.model, self.pool, config.prefill_chunk, config.max_batched_tokens,
                             config.max_num_seqs, config.batch_invariant)
        self.blocks = self.engine.blocks  # the one owner of blocks; called by self.room and the executor only
        self._lock = threading.RLock()  # the session map, eviction, commits and counters; never model work
        self.executor = DirectiveExecutor(self.engine, self.tokenizer, commit_lock=self._lock)
        self.auto = AutoDecider(config.auto)  # decides the auto edits of a batch, inside its transaction
        self.stats = RuntimeStats()
        self.tenancy = Tenancy(num_blocks)
        self._sessions: dict[tuple[str, str], Session] = {}
        self._evicted: set[tuple[str, str]] = set()
        # the one lock per session, keyed (tenant, session id); the server holds it across a chat turn
        self.session_locks = KeyedLocks()
        self.max_positions = self.model.config.max_position_embeddings
        self.max_request_tokens = min(config.max_request_tokens or self.max_positions, self.max_positions)
        self.admission = Admission(self.max_positions, self.max_request_tokens, config.block_size, num_blocks)
        self.room = CacheRoom(self.blocks, self.admission, self.tenancy, self.stats, self._lock,
                              self._sessions, self._evicted)

    # -- sessions ------------------------------------------------------------------

    def create_session(self, request: SessionCreate, tenant: str = DEFAULT_TENANT) -> SessionInfo:
        sid = request.session_id or f"sess_{uuid.uuid4().hex[:16]}"
        self._check_new(tenant, sid)
        return self._create(sid, tenant, request.messages, self._encode_new(request.messages)).info()

    def _create(self, sid: str, tenant: str, messages: list[Message], tokens: list[list[int]]) -> Session:
        # Not in the map while it is prefilled: nobody else can reach it yet.
        session = Session(sid, tenant, BlockTable(self.pool.block_size),
                          drift=DriftState(budget=self.config.auto.drift_budget))
        self.prefill_messages(session, messages, tokens)
        self._register(session)
        return session

    def _register(self, session: Session) -> None:
        """Put a session whose rows are written into the map (its blocks go back if the id is taken)."""
        key = (session.tenant, session.session_id)
        with self._lock:
            if key in self._sessions:  # a concurrent create won
                self.room.release(session.table)
                self._check_new(*key)
            self._sessions[key] = session
            self._evicted.discard(key)
            session.last_used = time.monotonic()

    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT,
                    include_messages: bool = False) -> SessionInfo:
        with self._lock:
            return self._get(tenant, session_id).info(include_messages)

    def list_sessions(self, tenant: str = DEFAULT_TENANT) -> list[SessionInfo]:
        with self._lock:
            return [s.info() for (t, _), s in self._sessions.items() if t == tenant]

    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> None:
        with self.hold(session_id, tenant) as session, self._lock:  # after its work in flight
            self.room.release(session.table)
            del self._sessions[(tenant, session_id)]

    def session_messages(self, session_id: str, tenant: str = DEFAULT_TENANT) -> tuple[list[Message], int]:
        with self._lock:
            s = self._get(tenant, session_id)
            return list(s.messages), s.version

    def relabel(self, session_id: str, tenant: str, renames: list[Directive]) -> None:
        """Apply id-only edits (``BatchPlan.local``: replacements that render exactly like what they
        replace) to the session's messages; no token changes, so neither rows nor the version do."""
        if renames:
            with self.hold(session_id, tenant) as session:
                session.messages = apply_directives(session.messages, renames)

    def was_evicted(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """The session is gone because the cache evicted it (not deleted, never created)."""
        return (tenant, session_id) in self._evicted

    def has_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        return (tenant, session_id) in self._sessions

    def session_count(self) -> int:
        """Live sessions over all tenants (for metrics)."""
        return len(self._sessions)

    def max_session_drift(self) -> float:
        """The largest accumulated drift of any live session (for metrics)."""
        return max((s.drift.drift for s in list(self._sessions.values())), default=0.0)

    def session_keys(self) -> list[tuple[str, str]]:
        """``(tenant, session_id)`` of every live session, least recently used first."""
        with self._lock:
            return [k for k, _ in sorted(self._sessions.items(), key=lambda kv: kv[1].last_used)]

    def restore_session(self, session_id: str, messages: list[Message], version: int,
                        tenant: str = DEFAULT_TENANT) -> SessionInfo:
        """Rebuild a saved session (prefill) at the version it had, so clients' ``expected_version`` holds."""
        # Not a request: --max-request-tokens does not apply. The prefill runs without the runtime lock.
        session = self._create(session_id, tenant, messages, self.tokenizer.encode_messages(messages))
        with self._lock:
            session.version = version
            return session.info()

    # Read without the lock (a copy of the dict is atomic under the GIL): a metrics
    # scrape must not wait for a long prefill.
    def sessions_per_tenant(self) -> dict[str, int]:
        return dict(Counter(t for t, _ in list(self._sessions)))

    def blocks_per_tenant(self) -> Counter[str]:
        return self.tenancy.usage(list(self._sessions.values()))

    # -- mutations -----------------------------------------------------------------

    def append(self, session_id: str, messages: list[Message], tenant: str = DEFAULT_TENANT,
               expected_version: int | None = None) -> AppendResult:
        with self.hold(session_id, tenant) as session:
            check_version(session.session_id, session.version, expected_version)
            cached = session.num_tokens
            prefilled, _ = self.prefill_messages(session, messages)
            return AppendResult(
                session_id=session_id, version=session.version, num_tokens=session.num_tokens,
                num_messages=len(session.messages),
                usage=Usage(prompt_tokens=session.num_tokens, cached_tokens=cached, prefill_tokens=prefilled))

    def apply(self, batch: DirectiveBatch, tenant: str = DEFAULT_TENANT, rotate: bool = True) -> DirectiveResult:
        with self.hold(batch.session_id, tenant) as session:
            t0 = time.perf_counter()
            check_version(session.session_id, session.version, batch.expected_version)
            plan = self.executor.plan(session, batch.directives)
            self.admission.check_request_tokens(sum(len(toks) for e in plan.edits for toks in e.edit.tokens))
            self.admission.check_positions(len(plan.tokens))
            self.room.make_room(self.executor.blocks_needed(session, plan), session)
            self.executor.execute(session, plan, decide=self.auto.decide, rotate=rotate)
            reused, rotated, recomputed = plan.counts()  # the untouched prefix counts as reused
            self._tally(session, reused=reused, rotated=rotated, recomputed=recomputed)
            repaired = sum(o.auto.drift_repair_tokens for o in plan.outcomes if o.auto)
            if repaired:
                with self._lock:
                    self.stats.drift_repairs += 1
                    self.stats.drift_repaired_tokens += repaired
            return DirectiveResult(
                session_id=session.session_id, version=session.version, num_tokens=session.num_tokens,
                num_messages=len(session.messages), outcomes=plan.outcomes,
                elapsed_ms=(time.perf_counter() - t0) * 1000)

    def generate(self, session_id: str, request: GenerateRequest, tenant: str = DEFAULT_TENANT,
                 on_token: Callable[[int], None] | None = None,
                 processors: list[LogitsProcessor] | None = None) -> GenerateResponse:
        """``on_token(id)`` (optional) sees each sampled token as it is chosen, for streaming; it runs
        on the engine thread between two steps of every session, so it must be quick and must not
        block (raising ends this generation and leaves the session as it was);
        ``processors`` (optional) constrain or bias the choice (see :mod:`.sampling`)."""
        with self.hold(session_id, tenant) as session:
            check_version(session.session_id, session.version, request.expected_version)
            new_tokens = self._encode_new(request.messages)
            self.admission.check_generation(session.num_tokens + sum(map(len, new_tokens)), request.max_tokens)
            cached = session.num_tokens
            header = [self.tokenizer.role_ids["assistant"]]
            prefilled, first_logits = self.prefill_messages(session, request.messages, new_tokens, then=header)
            message, gen = self._generate(session, request, on_token, processors, first_logits)
            prompt_len = cached + prefilled + 1  # + the assistant header
            usage = Usage(prompt_tokens=prompt_len, cached_tokens=cached, prefill_tokens=prefilled + 1,
                          completion_tokens=len(gen.tokens),
                          total_tokens=prompt_len + len(gen.tokens))
            finish = "tool_calls" if message.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
            if any(isinstance(p, GrammarProcessor) and p.closing for p in processors or []):
                finish = "length"  # the grammar closed the reply early: the budget ended it
            logprobs = (content_logprobs(self.tokenizer, gen.tokens, gen.logprobs, message.content)
                        if request.logprobs else None)
            return GenerateResponse(session_id=session_id, message=message, finish_reason=finish, usage=usage,
                                    logprobs=logprobs, version=session.version)

    # -- work no client asks for (benches and tests, through leyline_runtime.inspection) -------

    def fork_session(self, session_id: str, tenant: str = DEFAULT_TENANT, fork_id: str | None = None) -> str:
        """A new session with this one's messages, tokens, version, drift and cache rows (bit for
        bit, no prefill); -> its id. The rows are copied into blocks of its own: the block manager
        counts no references, so two live sessions never share a block."""
        with self.hold(session_id, tenant) as source:
            fork_id = fork_id or f"{session_id}-fork-{uuid.uuid4().hex[:8]}"
            self._check_new(tenant, fork_id)
            n, rows = source.num_tokens, self.pool.rows
            table = self.room.new_table(n, source)
            try:
                rows[:, table.rows(0, n, rows.device)] = rows[:, source.table.rows(0, n, rows.device)]
            except BaseException:
                self.room.release(table)
                raise
            fork = Session(fork_id, tenant, table, [m.model_copy() for m in source.messages],
                           [list(t) for t in source.message_tokens], version=source.version,
                           drift=source.drift.copy())
        self._register(fork)
        return fork_id

    def recompute(self, session_id: str, start: int, end: int, tenant: str = DEFAULT_TENANT) -> int:
        """Recompute the session's rows ``[start, end)`` against the rows before them (copy-on-write,
        committed by swapping its table; rows from ``end`` on are not touched; its drift record moves
        past them); -> the rows recomputed, counted as the session's recomputed tokens."""
        with self.hold(session_id, tenant) as session:
            if start >= end:
                return 0
            self.room.make_room(self.pool.blocks_for(end) - start // self.pool.block_size, session)
            self.executor.recompute(session, start, end)
            self._tally(session, recomputed=end - start)
            return end - start

    # -- internals -----------------------------------------------------------------

    def _get(self, tenant: str, session_id: str) -> Session:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            hint = (" (it was evicted from the cache: send its full history again, e.g. through "
                    "/v1/chat/completions, to rebuild it)") if (tenant, session_id) in self._evicted else ""
            raise SessionNotFound(f"session {session_id} not found{hint}")
        session.last_used = time.monotonic()
        return session

    def _check_new(self, tenant: str, session_id: str) -> None:
        if (tenant, session_id) in self._sessions:
            raise SessionExists(f"session {session_id} already exists")

    def _encode_new(self, messages: list[Message]) -> list[list[int]]:
        new_tokens = self.tokenizer.encode_messages(messages)
        self.admission.check_request_tokens(sum(map(len, new_tokens)))
        return new_tokens

    def check_generation(self, prompt_tokens: int, max_tokens: int, new_tokens: int = 0) -> None:
        """Raise what :meth:`generate` would raise for a prompt of ``prompt_tokens`` (``new_tokens`` of them
        new) before changing anything (the chat service calls it before it edits or rebuilds a session)."""
        self.admission.check_generation(prompt_tokens, max_tokens, new_tokens)

    def edited_length(self, session_id: str, tenant: str, directives: list) -> int:
        """Tokens the session would hold after ``directives`` (validates them; changes nothing)."""
        with self._lock:
            session = self._get(tenant, session_id)
            return len(self.executor.plan(session, directives).tokens) if directives else session.num_tokens

    @contextmanager
    def hold(self, session_id: str, tenant: str = DEFAULT_TENANT) -> Iterator[Session]:
        """The session, for work serialised with its other work; busy (never evicted) meanwhile."""
        with self._lock:
            session = self._get(tenant, session_id)
            session.busy += 1
        try:
            with self.session_locks.hold((tenant, session_id)):
                if self._sessions.get((tenant, session_id)) is not session:  # deleted while we waited
                    raise SessionNotFound(f"session {session_id} not found")
                yield session
        finally:
            with self._lock:
                session.busy -= 1
                session.last_used = time.monotonic()

    def prefill_messages(self, session: Session, messages: list[Message], new_tokens: list[list[int]] | None = None,
                         then: list[int] | None = None, logits: str = "last") -> tuple[int, torch.Tensor | None]:
        """Append messages to a held session (:meth:`hold`), prefilling only them (``new_tokens``: already
        encoded); -> (tokens prefilled, logits).

        ``then`` (the next message's header) is prefilled in the same engine
        step, past the committed tokens; the logits returned are its last
        position's (``logits="last"``) or every prefilled position's (``"all"``).
        """
        if not messages:
            return 0, None
        if new_tokens is None:
            new_tokens = self._encode_new(messages)
        flat = [t for toks in new_tokens for t in toks]
        start = session.num_tokens
        self.room.grow(session, start + len(flat) + len(then or []))
        try:
            logits = self.engine.prefill(session.table, flat + list(then or []), start,
                                         logits=logits if then else "none")
        except BaseException:
            self.room.trim(session.table, start)
            raise
        with self._lock:
            session.messages.extend(messages)
            session.message_tokens.extend(new_tokens)
            session.version += 1
            self._tally(session, prefilled=len(flat), reused=start)
        return len(flat), logits

    def _tally(self, session: Session, prefilled: int = 0, reused: int = 0, rotated: int = 0,
               recomputed: int = 0) -> None:
        """Count prompt tokens on the session and runtime-wide (metrics) alike."""
        with self._lock:
            for c in (session.counters, self.stats, self.tenancy.stats_of(session.tenant)):
                c.prefilled_tokens += prefilled
                c.reused_tokens += reused
                c.rotated_tokens += rotated
                c.recomputed_tokens += recomputed

    def _generate(self, session: Session, request: GenerateRequest,
                  on_token: Callable[[int], None] | None = None,
                  processors: list[LogitsProcessor] | None = None,
                  first_logits: torch.Tensor | None = None) -> tuple[Message, Generation]:
        """Generate one assistant message into the session (header, tokens, end marker).

        ``first_logits``: the header's row is already written and these are its logits.
        """
        start = session.num_tokens
        header = self.tokenizer.role_ids["assistant"]
        budget = min(start + 1 + request.max_tokens + 1, self.max_positions)
        self.room.grow(session, start + 1)
        try:
            self.room.grow(session, budget)  # reserved up front: other sessions allocate while this one decodes
            logits = first_logits if first_logits is not None else self.engine.prefill(session.table, [header], start)
            gen = self.engine.decode(session.table, start + 1, logits, request, {self.tokenizer.end_id},
                                     self.max_positions - 1, decode_text=self.tokenizer.decode,
                                     on_token=on_token, processors=processors)
            message, tokens = reply_message(self.tokenizer, gen.tokens, gen.stop_string)
            written = [header, *gen.tokens[:-1]]
            common = 0
            while common < min(len(written), len(tokens)) and written[common] == tokens[common]:
                common += 1
            self.room.reserve(session.table, start + len(tokens))
            self.engine.prefill(session.table, tokens[common:], start + common, logits="none")
        except BaseException:
            # Back to the committed tokens: the header row past them (written by generate()'s
            # prefill, on a fresh block when they end on a block boundary) is not kept.
            self.room.trim(session.table, start)
            raise
        self.room.trim(session.table, start + len(tokens))
        with self._lock:
            session.messages.append(message)
            session.message_tokens.append(tokens)
            session.version += 1
        self._tally(session, prefilled=1, reused=start)  # the assistant header
        return message, gen
