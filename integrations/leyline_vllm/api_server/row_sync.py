"""A session's prompts through vLLM with row plans: the history's rows kept, rotated or computed.

Every step that changes a session's history runs its new prompt through vLLM with a row plan
(:func:`~leyline_vllm.api_server.row_plan.plan_turn`): the unchanged prefix is loaded, for
``amortize`` the longest run after the edit is loaded with its rope part rotated (its replacement is
prefilled first, by a request of its own), everything else is computed by vLLM. Where an edit's
following tokens land comes from the directive's own spans (:class:`~.row_plan.Run`). The session's
snapshot becomes the prompt's rows, held in vLLM's paged cache until the next step releases them.

Exact rows are shared, approximate rows private (the rule of vLLM RFC #44223): a request whose prompt
carries approximate rows (rotated rows, and everything computed after them:
:attr:`~leyline_vllm.api_server.row_plan.Snapshot.exact`) runs with the session's own ``cache_salt``,
so vLLM's prefix cache never hands those blocks to another request; every other request is exact and
unsalted, so a system prompt and tool definitions that many sessions share are computed once.

A model whose cache the worker cannot splice (``refusal``) runs every prompt without a row plan:
vLLM's own prefix cache keeps what it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from leyline_runtime.outcome_rule import NO_SAVED_ROWS
from leyline_sdk.protocol import AutoDecision

from ..kv.wire import RowCopy, request_params
from .auto_edits import AutoRule, AutoVerdict
from .engine import EngineResult, run_prompt
from .metrics import ReplicaStats
from .row_plan import Run, Snapshot, TurnPlan, plan_turn
from .session import VllmSession

ONE_TOKEN = {"max_tokens": 1, "temperature": 0.0}


@dataclass
class Sync:
    """What one history change cost: the engine results and the row accounting."""

    results: list[EngineResult]
    plan: TurnPlan
    reused: int = 0
    rotated: int = 0
    computed: int = 0
    fallback: str | None = None
    auto: AutoDecision | None = None  # what an auto batch decided (None: not one)
    refusal: str | None = None  # why the worker does not splice this model's cache (None: it does)

    @property
    def last(self) -> EngineResult:
        return self.results[-1]

    @property
    def prompt_len(self) -> int:
        return self.results[-1].prompt_len if self.results else 0  # no results: an empty history


class RowSync:
    def __init__(self, engine_client, *, block_size: int, refusal: str | None, stats: ReplicaStats):
        self.engine = engine_client
        self.block_size = block_size
        self.refusal = refusal  # why the worker does not splice this model's cache (None: it does)
        self.stats = stats
        # released with the next request: requests are the way to the scheduler, which holds the blocks
        self._pending_release: list[str] = []

    async def sync(self, session: VllmSession, ids: list[int], *, runs: Sequence[Run | None] = (),
                   sampling: dict | None = None, auto: AutoRule | None = None, edit_start: int = 0) -> Sync:
        """Run ``ids`` through vLLM with the session's row plan; the session's snapshot becomes ``ids``.

        ``runs``: per edit, where the old tokens after it land (:func:`.row_plan.plan_turn`; empty:
        nothing moves). ``auto``: the batch's edits are ``auto`` (none ``forget``): planned as an
        amortize with a signal window, decided between its two requests (:mod:`.auto_edits`);
        ``edit_start``: where the first edit starts, for the session's drift budget."""
        if not ids:  # an empty history (no messages, or every one removed): no prompt to run, no rows to keep
            if session.snapshot is not None:
                self.release_later([session.snapshot.key])
                session.snapshot = None
            return Sync([], TurnPlan(prefix=0))
        if self.refusal is not None:
            return await self._unspliced(session, ids, sampling)
        old = session.snapshot
        window = auto.config.signal_window if auto is not None else 0
        plan = plan_turn(old, ids, min_rotated=self.block_size, runs=runs, window=window)
        decision = auto.before_measuring(plan, len(ids)) if auto is not None else None
        if decision is not None:  # nothing to measure: an exact turn
            session.drift.recomputed_from(edit_start)
            plan = plan_turn(old, ids, min_rotated=self.block_size)
        # rows loaded from the snapshot past its exact part are approximate: such a request is salted
        prefix_exact = plan.prefix <= (old.exact_tokens if old else 0)
        results, scratch = [], []
        load: list[RowCopy] = list(plan.first)
        if (plan.rotated is not None or plan.window is not None) and plan.prefill_upto > plan.prefix:
            # the replacement (and a signal window) sits before the rotated rows: prefill it first
            key = session.new_key()
            results.append(await self._run(session, ids[:plan.prefill_upto], plan.first, key, ONE_TOKEN,
                                           salted=not prefix_exact))
            scratch.append(key)
            load = [RowCopy(key, 0, 0, plan.prefill_upto)] if results[0].report.saved == key else []
            if auto is not None and decision is None:
                verdict = await self._decide(auto, session, plan, key if load else None, edit_start, len(ids))
                decision = verdict.decision
                if not verdict.rotate:
                    plan = replace(plan, rotated=None)
                if verdict.repair_from is not None:  # past the drift budget: recompute from the earliest drift
                    plan = plan_turn(old, ids, min_rotated=self.block_size, keep=verdict.repair_from)
                    load, prefix_exact = list(plan.first), plan.prefix <= (old.exact_tokens if old else 0)
        if plan.rotated is not None and results and not load:  # the replacement's rows were not saved
            plan = replace(plan, rotated=None, unmoved={**plan.unmoved, plan.run: NO_SAVED_ROWS})
        rotating = plan.rotated is not None
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
        sync = _account(plan, results)
        sync.auto = decision
        return sync

    async def _decide(self, auto: AutoRule, session: VllmSession, plan: TurnPlan, window_key: str | None,
                      edit_start: int, prompt_len: int) -> AutoVerdict:
        """Measure the window the first request computed against the rows amortize would have moved there."""
        per_layer = None
        if window_key is not None and session.snapshot is not None:
            w = plan.window
            answers = await self.engine.collective_rpc(
                "leyline_drift", args=(session.snapshot.key, w.src_start, window_key, w.dst_start, w.count))
            per_layer = answers[0] if answers and all(a is not None for a in answers) else None
            if per_layer is not None and len(answers) > 1:  # tensor parallel: each rank measured its heads
                per_layer = [sum(a[i] for a in answers) / len(answers) for i in range(len(per_layer))]
        return auto.after_measuring(plan, session.drift, per_layer, edit_start, prompt_len)

    async def _unspliced(self, session: VllmSession, ids: list[int], sampling: dict | None) -> Sync:
        """``ids`` through vLLM without a row plan (the model is not spliced): nothing rotates, so every
        row is exact and the request unsalted; vLLM's own prefix cache supplies what it holds."""
        result = await run_prompt(self.engine, ids, sampling or ONE_TOKEN, {}, None)
        return Sync([result], TurnPlan(prefix=0), reused=result.prompt_len - result.computed,
                    computed=result.computed, refusal=self.refusal)

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
            self.release_later([*pending, save])
            raise
        self.stats.observe(result.report)
        return result

    def release_later(self, keys: list[str]) -> None:
        """Release ``keys`` with the next request (or by TTL or pressure if none comes)."""
        self._pending_release.extend(keys)


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
