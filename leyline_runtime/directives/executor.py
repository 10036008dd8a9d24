"""The directive executor: plan a batch as a whole, then run it as one transaction.

Planning turns the batch (which addresses the session as it was before it)
into the new message list and one position map: every new position is either
an old row moved by δ (copy ``c_kv``, rotate ``k_pe``) or a token to prefill.
Execution writes every changed row into fresh blocks — one rotate-and-splice
pass over all layers, then the prefills in position order — and commits by
swapping the block table. Nothing of the session changes before the commit,
so an error anywhere leaves it exactly as it was. Every batch, whatever its modes,
runs through :meth:`DirectiveExecutor.execute`, and the executor takes, commits and
gives back every block of it. ``auto`` edits are planned as amortize; a batch with
one is handed inside the transaction to the caller's ``decide`` (``auto_mode.py``),
which measures them on the spliced rows and may recompute, before the commit; any
other batch only walks its edits for the session's drift record (``batch_drift.py``).
The executor knows nothing of auto mode: the dependency goes one way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import torch

import leyline_kernels as kernels
from leyline_sdk.errors import InvalidDirective, InvalidSpan, OverlappingSpans
from leyline_sdk.protocol import AutoDecision, Directive, DirectiveOutcome, Message

from leyline_runtime.text import chat_template as tpl
from leyline_runtime.auto_rule import DriftState
from leyline_runtime.outcome_rule import applied_modes, erased_auto, planned_mode
from leyline_runtime.engine.engine import Engine
from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.directives.batch_drift import new_starts, recomputed_rows, walk_batch
from leyline_runtime.directives.recompute import blocks_to_copy, recompute_rows
from leyline_runtime.sessions.session import Session
from leyline_runtime.text.tokenizer import ChatTokenizer

PREFILL = -1  # Plan.old_pos of a row that is computed, not moved


@dataclass
class MessageEdit:
    """A directive lifted to whole messages: old ``[start, end)`` -> ``messages``."""

    index: int  # the directive's position in the batch
    start: int
    end: int
    messages: list[Message]
    tokens: list[list[int]]
    mode: str  # the mode it is planned in (an erase: forget; outcome_rule.planned_mode)
    requested_mode: str = "amortize"
    intent: str = "shrink"


@dataclass
class TokenEdit:
    edit: MessageEdit
    old_start: int  # after common prefix/suffix minimisation
    old_end: int
    new_tokens: list[int]
    applied_mode: str = "amortize"
    fallback_reason: str | None = None
    auto: AutoDecision | None = None  # requested "auto": what was chosen

    @property
    def delta(self) -> int:
        return len(self.new_tokens) - (self.old_end - self.old_start)


@dataclass
class Plan:
    messages: list[Message]
    message_tokens: list[list[int]]
    tokens: list[int]
    # per new position: the old position its row moves from, or PREFILL
    old_pos: torch.Tensor
    edits: list[TokenEdit]
    first_change: int  # first new position whose row is not the old row at that position
    outcomes: list[DirectiveOutcome] = field(default_factory=list)
    drift: DriftState | None = None  # the session's drift state after the batch (set in the transaction)

    @property
    def has_auto(self) -> bool:
        """Some edit asked for ``mode: "auto"``: the transaction hands the batch to its decider."""
        return any(t.edit.mode == "auto" for t in self.edits)

    def counts(self) -> tuple[int, int, int]:
        """Rows (reused in place, moved, computed) over the whole new sequence."""
        computed = self.old_pos == PREFILL
        reused = self.old_pos == torch.arange(len(self.old_pos))
        return int(reused.sum()), int((~computed & ~reused).sum()), int(computed.sum())


@dataclass
class Transaction:
    """A batch being executed: its new table, and the blocks it took (given back if it fails)."""

    table: BlockTable
    owned: list[int]
    engine: Engine
    tokens: list[int]  # the sequence the table holds once the batch is done

    def recompute(self, start: int, end: int) -> None:
        """Recompute rows ``[start, end)`` of the new table against the rows before them; the blocks
        it copies on write are the transaction's (its own blocks are written in place)."""
        shared = blocks_to_copy(self.table, len(self.tokens), start, end, self.owned)
        fresh = self.engine.blocks.take(len(shared))
        self.owned.extend(fresh)
        self.table = recompute_rows(self.engine, self.table, self.tokens, start, end, dict(zip(shared, fresh)))


def common_ends(old: list[int], new: list[int]) -> tuple[int, int]:
    """Lengths of the common prefix and of the common suffix after it (they never overlap)."""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
        s += 1
    return p, s


def _strongest(modes: set[str]) -> str:
    return next(m for m in ("forget", "auto", "amortize") if m in modes)


class DirectiveExecutor:
    def __init__(self, engine: Engine, tokenizer: ChatTokenizer, kernel: Callable = kernels.rotate_and_splice,
                 commit_lock=None):
        self.engine = engine
        self.commit_lock = commit_lock or contextlib.nullcontext()  # readers see a session before or after
        self.tokenizer = tokenizer
        self.kernel = kernel  # tests swap in a faulty kernel to check atomicity

    # -- planning ------------------------------------------------------------------

    def plan(self, session: Session, directives: list[Directive]) -> Plan:
        edits = self._message_edits(session, directives)
        token_edits = self._token_edits(session, edits)
        self._choose_modes(token_edits)
        return self._position_map(session, edits, token_edits)

    def _message_edits(self, session: Session, directives: list[Directive]) -> list[MessageEdit]:
        n = len(session.messages)
        edits: list[MessageEdit] = []
        token_directives: dict[int, list[tuple[int, Directive]]] = {}
        for i, d in enumerate(directives):
            if d.span.unit == "message":
                if d.span.end > n:
                    raise InvalidSpan(f"directive {i}: message span [{d.span.start}, {d.span.end}) "
                                      f"exceeds the session's {n} messages")
                msgs = list(d.replacement)
                edits.append(MessageEdit(i, d.span.start, d.span.end, msgs, self.tokenizer.encode_messages(msgs),
                                         planned_mode(d.mode, d.intent), d.mode, d.intent))
            else:
                msg = self._message_of_token_span(session, i, d)
                token_directives.setdefault(msg, []).append((i, d))
        for msg, items in token_directives.items():
            edits.append(self._content_edit(session, msg, items))
        edits.sort(key=lambda e: (e.start, e.end))
        for a, b in zip(edits, edits[1:]):
            if b.start < a.end or (a.start == a.end == b.start == b.end):
                raise OverlappingSpans(f"directives {a.index} and {b.index} overlap")
        return edits

    def _message_of_token_span(self, session: Session, i: int, d: Directive) -> int:
        off = session.offsets()
        for m in range(len(session.messages)):
            lo, hi = self._content_range(session, m, off)
            if lo <= d.span.start and d.span.end <= hi:
                return m
        raise InvalidSpan(f"directive {i}: token span [{d.span.start}, {d.span.end}) "
                          "is not inside one message's content")

    def _content_range(self, session: Session, m: int, off: list[int]) -> tuple[int, int]:
        """Absolute token range of message m's content (after the header, before tool calls / end)."""
        toks = session.message_tokens[m]
        call_id = self.tokenizer.token_id(tpl.TOOL_CALL)
        body_end = len(toks) - 1
        if call_id in toks:
            body_end = toks.index(call_id)
        return off[m] + 1, off[m] + body_end

    def _content_edit(self, session: Session, m: int, items: list[tuple[int, Directive]]) -> MessageEdit:
        off = session.offsets()
        lo, hi = self._content_range(session, m, off)
        content_ids = session.message_tokens[m][1: 1 + hi - lo]
        items = sorted(items, key=lambda it: (it[1].span.start, it[1].span.end))
        for (ia, a), (ib, b) in zip(items, items[1:]):
            if a.span.overlaps(b.span):
                raise OverlappingSpans(f"directives {ia} and {ib} overlap")
        pieces, cursor = [], 0
        for i, d in items:
            s, e = d.span.start - lo, d.span.end - lo
            pieces.append(self.tokenizer.decode(content_ids[cursor:s]))
            rep = d.replacement
            pieces.append(rep if isinstance(rep, str) else self._token_text(i, list(rep)))
            cursor = e
        pieces.append(self.tokenizer.decode(content_ids[cursor:]))
        old = session.messages[m]
        new = old.model_copy(update={"content": "".join(pieces)})
        # one edit of the message's content: the strongest of its directives' modes, an erase if any erases
        requested = _strongest({d.mode for _, d in items})
        intent = "erase" if any(d.intent == "erase" for _, d in items) else "shrink"
        return MessageEdit(items[0][0], m, m + 1, [new], [self.tokenizer.encode_message(new)],
                           planned_mode(requested, intent), requested, intent)

    def _token_text(self, i: int, ids: list[int]) -> str:
        """Token-unit replacement ids as content text; ids outside the vocabulary or special are refused."""
        bad = [t for t in ids if t >= self.tokenizer.vocab_size or t in self.tokenizer.control_ids]
        if bad:
            raise InvalidDirective(f"directive {i}: replacement token ids {bad[:5]} are outside the vocabulary "
                                   f"(size {self.tokenizer.vocab_size}) or special tokens of the template")
        return self.tokenizer.decode(ids)

    def _token_edits(self, session: Session, edits: list[MessageEdit]) -> list[TokenEdit]:
        off = session.offsets()
        out = []
        for e in edits:
            old = [t for toks in session.message_tokens[e.start:e.end] for t in toks]
            new = [t for toks in e.tokens for t in toks]
            # Token-level minimisation: keep the common prefix and suffix rows.
            p, s = common_ends(old, new)
            out.append(TokenEdit(e, off[e.start] + p, off[e.end] - s, new[p: len(new) - s]))
        return out

    def _choose_modes(self, token_edits: list[TokenEdit]) -> None:
        """Each edit's applied mode by the rule both engines share (:mod:`leyline_runtime.outcome_rule`).
        The edits are planned before the session's length is looked at: a refused rotation forgets from
        the first edit on, whether rows follow it or not."""
        layout = self.engine.model.cache_layout()
        rotates = layout.inv_freq is not None and len(layout.rotary_slices) == 1
        applied = applied_modes([t.edit.requested_mode for t in token_edits],
                                intents=[t.edit.intent for t in token_edits],
                                unsupported=None if rotates else "the cache layout has no single rotary slice")
        for t, a in zip(token_edits, applied):
            t.applied_mode, t.fallback_reason = a.mode, a.fallback_reason

    def _position_map(self, session: Session, edits: list[MessageEdit], token_edits: list[TokenEdit]) -> Plan:
        messages, message_tokens = list(session.messages), list(session.message_tokens)
        for e in reversed(edits):
            messages[e.start:e.end] = e.messages
            message_tokens[e.start:e.end] = e.tokens
        old_tokens = session.tokens
        tokens: list[int] = []
        pieces: list[torch.Tensor] = []  # old position per new position, PREFILL for new rows
        forget_from = None
        cursor = 0
        for t in token_edits:
            pieces.append(torch.arange(cursor, t.old_start))
            tokens.extend(old_tokens[cursor:t.old_start])
            if t.applied_mode == "forget" and forget_from is None:
                forget_from = len(tokens)
            tokens.extend(t.new_tokens)
            pieces.append(torch.full((len(t.new_tokens),), PREFILL))
            cursor = t.old_end
        pieces.append(torch.arange(cursor, len(old_tokens)))
        tokens.extend(old_tokens[cursor:])
        old_pos = torch.cat(pieces).long()
        if forget_from is not None:
            old_pos[forget_from:] = PREFILL
        changed = (old_pos != torch.arange(len(old_pos))).nonzero()
        first_change = int(changed[0]) if len(changed) else min(len(tokens), len(old_tokens))
        plan = Plan(messages, message_tokens, tokens, old_pos, token_edits, first_change)
        plan.outcomes = self._outcomes(plan)
        return plan

    @staticmethod
    def _outcomes(plan: Plan) -> list[DirectiveOutcome]:
        """Attribute every new position to the edit whose region (its start up to the next edit) holds it."""
        edits = plan.edits
        new_start = new_starts(edits)
        # the first edit's region starts at 0: the kept prefix before it is reused rows too
        bounds = [0, *new_start[1:], len(plan.tokens)] if edits else [len(plan.tokens)]
        positions = torch.arange(len(plan.tokens))
        results: dict[int, DirectiveOutcome] = {}
        for k, t in enumerate(edits):
            region = plan.old_pos[bounds[k]:bounds[k + 1]]
            recomputed = int((region == PREFILL).sum())
            reused = int((region == positions[bounds[k]:bounds[k + 1]]).sum())
            results[t.edit.index] = DirectiveOutcome(
                requested_mode=t.edit.requested_mode, intent=t.edit.intent, applied_mode=t.applied_mode,
                fallback_reason=t.fallback_reason,
                token_start=t.old_start, token_end=t.old_end, delta=t.delta, reused_tokens=reused,
                rotated_tokens=len(region) - recomputed - reused, recomputed_tokens=recomputed,
                auto=t.auto or erased_auto(t.edit.requested_mode, t.fallback_reason))
        return [results[i] for i in sorted(results)]

    # -- execution -----------------------------------------------------------------

    def execute(self, session: Session, plan: Plan, *, decide: Callable[[Session, Plan, Transaction], None],
                rotate: bool = True) -> None:
        """Run ``plan`` as one transaction: splice and prefill, then ``decide`` its ``auto`` edits if it
        has any (``AutoDecider.decide``), else walk its edits for the session's drift record; commit."""
        with self.transaction(session, plan, rotate) as txn:
            if plan.has_auto:
                decide(session, plan, txn)
            else:
                plan.drift = walk_batch(session.drift, plan.edits, session.drift.budget).state

    def blocks_needed(self, session: Session, plan: Plan) -> int:
        """Fresh blocks executing ``plan`` may take: the new table's past the kept prefix, and, in a batch
        with ``auto`` edits, the kept blocks a drift repair from the earliest stale row copies on write."""
        bs, earliest = self.engine.blocks.block_size, session.drift.earliest
        needed = max(0, self.engine.blocks.blocks_for(len(plan.tokens)) - self._kept_blocks(session, plan))
        if plan.has_auto and earliest is not None:
            needed += max(0, plan.first_change // bs - earliest // bs + 1)
        return needed

    def _kept_blocks(self, session: Session, plan: Plan) -> int:
        """The session's blocks before the first changed row: the new table shares them."""
        return min(plan.first_change // self.engine.blocks.block_size, len(session.table.blocks))

    @contextlib.contextmanager
    def transaction(self, session: Session, plan: Plan, rotate: bool = True) -> Iterator[Transaction]:
        """Splice and prefill ``plan`` into a new table, yield it, then commit it (outcomes recounted).

        Inside, the caller may recompute rows (:meth:`Transaction.recompute`) and change ``plan``'s
        edits; an error gives back every block taken."""
        blocks, bs = self.engine.blocks, self.engine.blocks.block_size
        old_table = session.table
        keep_blocks = self._kept_blocks(session, plan)
        txn = Transaction(*blocks.fork(old_table, keep_blocks, len(plan.tokens)), self.engine, plan.tokens)
        try:
            start = keep_blocks * bs
            self._splice(old_table, txn.table, plan, start, rotate)
            self._prefill_runs(txn.table, plan, start)
            yield txn
            plan.outcomes = self._outcomes(plan)
        except BaseException:
            blocks.release(txn.owned)
            raise
        self._commit(session, txn.table, plan)

    def recompute(self, session: Session, start: int, end: int) -> None:
        """Recompute the session's rows ``[start, end)`` against its cache as it stands; rows
        from ``end`` on are not touched. Copy-on-write, committed by swapping the table.

        The session's drift record moves past the recomputed rows (:func:`.batch_drift.recomputed_rows`)."""
        txn = Transaction(session.table, [], self.engine, session.tokens)
        try:
            txn.recompute(start, end)
        except BaseException:
            self.engine.blocks.release(txn.owned)
            raise
        with self.commit_lock:
            self.engine.blocks.commit(session.table, txn.table)
            session.table = txn.table
            recomputed_rows(session.drift, start, end, session.num_tokens)

    def _splice(self, old_table: BlockTable, new_table: BlockTable, plan: Plan, start: int, rotate: bool) -> None:
        new_pos = start + (plan.old_pos[start:] != PREFILL).nonzero().flatten()
        if not len(new_pos):
            return
        old_pos = plan.old_pos[new_pos]
        pool = self.engine.pool
        device = pool.rows.device
        dst, src = new_table.rows_at(new_pos), old_table.rows_at(old_pos)
        deltas = (new_pos - old_pos) if rotate else torch.zeros_like(new_pos)
        layout = pool.layout
        # One pass over all layers: layer l's rows sit l * rows_per_layer further on.
        layers = torch.arange(layout.num_layers, dtype=torch.long)[:, None] * pool.rows_per_layer
        src_all, dst_all = (layers + src).flatten(), (layers + dst).flatten()
        inv_freq = layout.inv_freq if layout.inv_freq is not None else torch.ones(1, dtype=torch.float64)
        index, cos, sin = kernels.delta_rotation_table(deltas, inv_freq, device)
        offset, width = layout.rotary_slices[0] if layout.rotary_slices else (0, 0)
        flat = pool.flat()
        self.kernel(flat, flat, src_all.to(device), dst_all.to(device), index.repeat(layout.num_layers),
                    cos, sin, offset, width)

    def _prefill_runs(self, table: BlockTable, plan: Plan, start: int) -> None:
        """Prefill every run of new rows as one piece of engine work (each run sees every row before it)."""
        new = plan.old_pos[start:] == PREFILL
        if not bool(new.any()):
            return
        # run boundaries: where "is new" flips (padded with False on both ends)
        flips = torch.diff(torch.cat((new.new_zeros(1), new, new.new_zeros(1))).int()).nonzero().flatten()
        bounds = (flips + start).tolist()
        runs = [(lo, plan.tokens[lo:hi]) for lo, hi in zip(bounds[::2], bounds[1::2])]
        self.engine.prefill_runs(table, runs)

    def _commit(self, session: Session, table: BlockTable, plan: Plan) -> None:
        with self.commit_lock:
            self.engine.blocks.commit(session.table, table)
            self._swap(session, table, plan)

    @staticmethod
    def _swap(session: Session, table: BlockTable, plan: Plan) -> None:
        session.table = table
        session.messages = plan.messages
        session.message_tokens = plan.message_tokens
        if plan.drift is not None:
            session.drift = plan.drift
        session.version += 1
