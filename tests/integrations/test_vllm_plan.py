"""leyline_vllm.api_server.row_plan: which saved rows an edited prompt takes, and how (pure bookkeeping, no vLLM)."""

from leyline_runtime.outcome_rule import NO_SAVED_ROWS, ONE_RUN_PER_BATCH, SHORT_RUN
from leyline_vllm.api_server.row_plan import Run, Snapshot, plan_turn
from leyline_vllm.kv.wire import RowCopy, covered, truncate


def test_append_only_keeps_the_whole_snapshot():
    plan = plan_turn(Snapshot("k", [1, 2, 3, 4]), [1, 2, 3, 4, 5, 6], min_rotated=2)
    assert plan.prefix == 4 and plan.first == [RowCopy("k", 0, 0, 4)] and plan.rotated is None


def test_deletion_rotates_the_rest_back_without_a_prefill():
    old = list(range(100))
    new = old[:40] + old[60:]
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(60, 40, 40)])
    assert plan.prefix == 40 and plan.prefill_upto == 40 and plan.run == 0
    assert plan.rotated == RowCopy("k", 60, 40, 40, delta=-20)
    assert covered(plan.first + [plan.rotated]) == 80


def test_replacement_is_prefilled_before_the_rotated_run():
    old = list(range(100))
    new = old[:30] + [500, 501, 502] + old[50:]
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(50, 33, 50)])
    assert plan.prefix == 30 and plan.prefill_upto == 33
    assert plan.rotated == RowCopy("k", 50, 33, 50, delta=-17)


def test_forget_keeps_only_the_prefix():
    old = list(range(100))
    plan = plan_turn(Snapshot("k", old), old[:30] + [7] + old[50:], min_rotated=16)
    assert plan.prefix == 30 and plan.rotated is None and plan.first == [RowCopy("k", 0, 0, 30)]


def test_short_runs_are_not_worth_rotating():
    old = list(range(40))
    plan = plan_turn(Snapshot("k", old), old[:30] + [7] + old[35:], min_rotated=16, runs=[Run(35, 31, 5)])
    assert plan.rotated is None and plan.unmoved[0].startswith(SHORT_RUN)


def test_no_snapshot_loads_nothing():
    plan = plan_turn(None, [1, 2, 3], min_rotated=1, runs=[Run(0, 1, 2)])
    assert plan.first == [] and plan.unmoved == {0: NO_SAVED_ROWS}


def test_two_identical_edits_each_declare_their_own_run():
    """The same replacement at two places, around repeated text: each edit's run is where its directive
    put it; the longer one is moved, the other named as computed."""
    a, b = list(range(100, 120)), list(range(200, 230))
    rep = [7, 7, 7]
    old = [1, 2] + [9] * 4 + a + [9] * 4 + b + [3]
    new = [1, 2] + rep + a + rep + b + [3]
    runs = [Run(6, 5, 20), Run(30, 28, 31)]  # after the first edit: a; after the second: b and the end
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=runs)
    assert plan.prefix == 2 and plan.run == 1 and plan.rotated == RowCopy("k", 30, 28, 31, delta=-2)
    assert plan.unmoved == {0: ONE_RUN_PER_BATCH} and plan.prefill_upto == 28


def test_an_inserted_copy_moves_the_original_where_a_diff_finds_nothing_to_move():
    """A message inserted before an identical one: the common prefix already covers the copy (same tokens
    at the same positions: exact rows), and the directive says the original moved after it. A diff of
    what follows the prefix would find no run to move (the old history's rest is only the end)."""
    a = list(range(100, 120))
    old, new = [1, 2] + a + [3], [1, 2] + a + a + [3]
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(2, 22, 21)])
    assert plan.prefix == 22 and plan.rotated == RowCopy("k", 2, 22, 21, delta=20)
    assert covered(plan.first + [plan.rotated]) == len(new)


def test_a_run_is_cut_where_the_snapshot_stops_holding_its_tokens():
    """A snapshot ends with the reply vLLM generated, which the history may render otherwise: only the
    tokens the snapshot holds as the prompt has them are moved."""
    old = list(range(100))
    new = old[:30] + [500] + old[40:90] + [77, 78]
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(40, 31, 52)])
    assert plan.rotated == RowCopy("k", 40, 31, 50, delta=-9)


def test_a_run_starting_inside_the_kept_prefix_is_moved_from_after_it():
    """A deletion whose next message starts like the deleted one (the same role token): the common
    prefix already keeps that token in place, so the moved run starts after it."""
    old = [1, 2, 50, 60, 61, 50] + list(range(100, 120))
    new = [1, 2, 50] + list(range(100, 120))
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(5, 2, 21)])
    assert plan.prefix == 3 and plan.rotated == RowCopy("k", 6, 3, 20, delta=-3)


def test_truncate_and_covered():
    copies = [RowCopy("a", 0, 0, 10), RowCopy("b", 20, 10, 10, 10)]
    assert covered(copies) == 20
    assert truncate(copies, 15) == [RowCopy("a", 0, 0, 10), RowCopy("b", 20, 10, 5, 10)]
    assert covered([RowCopy("a", 0, 0, 10), RowCopy("b", 0, 12, 3)]) == 10  # a gap ends the coverage


def test_plugin_never_imports_the_bundled_runtime():
    """Imports flow one way: the vLLM adapter uses leyline_sdk and leyline_kernels, and of the runtime only
    its torch-free REST surface (leyline_runtime.api), auto's rule (leyline_runtime.auto_rule) and the
    outcome rule (leyline_runtime.outcome_rule):
    docs/design.md's documented exceptions."""
    import ast
    from pathlib import Path

    import leyline_vllm

    for path in Path(leyline_vllm.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names = [n for n in names if n not in ("leyline_runtime.api", "leyline_runtime.auto_rule",
                                                   "leyline_runtime.outcome_rule")
                     and not n.startswith("leyline_runtime.api.")]
            assert not any(n.split(".")[0] in ("leyline_runtime", "leyline_langchain", "leyline_bench") for n in names), \
                f"{path.name} imports {names}"


def test_a_window_after_the_edit_is_computed_exactly_and_the_rest_rotated():
    old = list(range(200))
    new = old[:30] + [500, 501, 502] + old[50:]
    plan = plan_turn(Snapshot("k", old), new, min_rotated=16, runs=[Run(50, 33, 150)], window=32)
    assert plan.prefix == 30 and plan.prefill_upto == 33 + 32
    assert plan.window == RowCopy("k", 50, 33, 32, delta=-17)  # old rows 50..81 land at 33..64, recomputed
    assert plan.rotated == RowCopy("k", 82, 65, 150 - 32, delta=-17)
    short = plan_turn(Snapshot("k", old[:90]), new[:73], min_rotated=16, runs=[Run(50, 33, 40)], window=32)
    assert short.rotated is None and short.window.count == 32  # 8 left: not worth rotating
    assert short.unmoved[0].startswith(SHORT_RUN)


def test_keep_caps_the_kept_prefix():
    old = list(range(100))
    plan = plan_turn(Snapshot("k", old), old[:60] + [7] + old[61:], min_rotated=16, keep=20)
    assert plan.prefix == 20 and plan.first == [RowCopy("k", 0, 0, 20)]
