"""leyline_vllm.api_server.edits: a directive batch in tokens, planned by its own positions, and what each
directive was applied as (leyline_runtime.outcome_rule's words; no vLLM: the plan's bookkeeping only)."""

from leyline_sdk.protocol import Directive, DirectiveBatch, Message, Span
from leyline_vllm.api_server.edits import directive_outcomes, edit_spans, replacement_bounds
from leyline_vllm.api_server.row_plan import Run, Snapshot, TurnPlan, plan_turn
from leyline_vllm.api_server.row_sync import Sync

# six messages of 20 tokens each: message k is ids k*100 .. k*100+19
OLD = [list(range(k * 100, k * 100 + 20)) for k in range(6)]
OLD_BOUNDS = [(20 * k, 20 * k + 20) for k in range(6)]
REPLACEMENTS = {1: list(range(900, 910)), 4: list(range(950, 955))}  # message 1: 10 tokens, message 4: 5


def batch(*modes: str) -> DirectiveBatch:
    return DirectiveBatch(session_id="s", directives=[
        Directive(span=Span(start=k, end=k + 1), replacement=[Message(role="user", content=f"r{k}")], mode=mode)
        for k, mode in zip(REPLACEMENTS, modes)])


def outcomes_of(b: DirectiveBatch, **sync_fields):
    """Measure ``b`` as the service does (message bounds before and after it), plan it, report it."""
    new = [REPLACEMENTS.get(k, ids) for k, ids in enumerate(OLD)]
    ends = [sum(len(m) for m in new[:k]) for k in range(len(new) + 1)]
    spans = edit_spans(b, OLD_BOUNDS, [ends[k] for k in replacement_bounds(b)])
    plan = plan_turn(Snapshot("k", [t for m in OLD for t in m]), [t for m in new for t in m], min_rotated=16,
                     runs=spans.runs)
    return spans, directive_outcomes(spans, Sync([], sync_fields.pop("plan", plan), **sync_fields), 0)


def test_each_edit_sits_where_its_directive_put_it_and_declares_its_run():
    spans, _ = outcomes_of(batch("amortize", "amortize"))
    assert [(s.old_start, s.old_end, s.new_start, s.new_end, s.delta) for s in spans.spans] == [
        (20, 40, 20, 30, -10), (80, 100, 70, 75, -15)]
    assert spans.runs == [Run(40, 30, 40), Run(100, 75, 20)]


def test_an_amortize_before_a_forget_moves_its_run_and_keeps_its_mode():
    spans, outcomes = outcomes_of(batch("amortize", "forget"))
    assert spans.runs == [Run(40, 30, 40), None]  # a forget recomputes what follows it
    assert [(o.applied_mode, o.fallback_reason) for o in outcomes] == [("amortize", None), ("forget", None)]


def test_an_amortize_after_a_forget_is_recomputed_with_it():
    spans, outcomes = outcomes_of(batch("forget", "amortize"))
    assert spans.runs == [None, None]
    assert [(o.applied_mode, o.fallback_reason) for o in outcomes] == [("forget", None), ("forget", "after_forget")]


def test_vllm_moves_one_run_per_batch_and_names_the_other():
    _, outcomes = outcomes_of(batch("amortize", "amortize"))
    assert [(o.applied_mode, o.fallback_reason) for o in outcomes] == [
        ("amortize", None), ("forget", "one_run_per_batch")]


def test_a_model_vllm_does_not_splice_applies_amortize_as_forget_with_the_reason():
    _, outcomes = outcomes_of(batch("amortize", "amortize"), plan=TurnPlan(prefix=0), refusal="sliding window")
    assert [(o.applied_mode, o.fallback_reason) for o in outcomes] == [
        ("forget", "unsupported_runtime: sliding window"), ("forget", "after_forget")]


def test_a_failed_load_makes_every_directive_forget_with_its_reason():
    _, outcomes = outcomes_of(batch("amortize", "forget"), fallback="kv_load_failed: gone")
    assert [(o.applied_mode, o.fallback_reason) for o in outcomes] == [("forget", "kv_load_failed: gone")] * 2
