"""leyline_vllm.api_server.row_plan: which saved rows an edited prompt takes, and how (pure bookkeeping, no vLLM)."""

from leyline_vllm.api_server.row_plan import Snapshot, plan_turn
from leyline_vllm.kv.wire import RowCopy, covered, truncate


def test_append_only_keeps_the_whole_snapshot():
    plan = plan_turn(Snapshot("k", [1, 2, 3, 4]), [1, 2, 3, 4, 5, 6], rotate=True, min_rotated=2)
    assert plan.prefix == 4 and plan.first == [RowCopy("k", 0, 0, 4)] and plan.rotated is None


def test_deletion_rotates_the_rest_back_without_a_prefill():
    old = list(range(100))
    new = old[:40] + old[60:]
    plan = plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16)
    assert plan.prefix == 40 and plan.prefill_upto == 40
    assert plan.rotated == RowCopy("k", 60, 40, 40, delta=-20)
    assert covered(plan.first + [plan.rotated]) == 80


def test_replacement_is_prefilled_before_the_rotated_run():
    old = list(range(100))
    new = old[:30] + [500, 501, 502] + old[50:]
    plan = plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16)
    assert plan.prefix == 30 and plan.prefill_upto == 33
    assert plan.rotated == RowCopy("k", 50, 33, 50, delta=-17)


def test_forget_keeps_only_the_prefix():
    old = list(range(100))
    plan = plan_turn(Snapshot("k", old), old[:30] + [7] + old[50:], rotate=False, min_rotated=16)
    assert plan.prefix == 30 and plan.rotated is None and plan.first == [RowCopy("k", 0, 0, 30)]


def test_short_runs_are_not_worth_rotating():
    old = list(range(40))
    plan = plan_turn(Snapshot("k", old), old[:30] + [7] + old[35:], rotate=True, min_rotated=16)
    assert plan.rotated is None and plan.reason


def test_no_snapshot_loads_nothing():
    assert plan_turn(None, [1, 2, 3], rotate=True, min_rotated=1).first == []


def test_truncate_and_covered():
    copies = [RowCopy("a", 0, 0, 10), RowCopy("b", 20, 10, 10, 10)]
    assert covered(copies) == 20
    assert truncate(copies, 15) == [RowCopy("a", 0, 0, 10), RowCopy("b", 20, 10, 5, 10)]
    assert covered([RowCopy("a", 0, 0, 10), RowCopy("b", 0, 12, 3)]) == 10  # a gap ends the coverage


def test_plugin_never_imports_the_bundled_runtime():
    """Imports flow one way: the vLLM adapter uses leyline_sdk and leyline_kernels, and of the runtime only
    its torch-free REST surface (leyline_runtime.api) and auto's rule (leyline_runtime.auto_rule):
    docs/design.md's documented exceptions."""
    import ast
    from pathlib import Path

    import leyline_vllm

    for path in Path(leyline_vllm.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names = [n for n in names if n not in ("leyline_runtime.api", "leyline_runtime.auto_rule")
                     and not n.startswith("leyline_runtime.api.")]
            assert not any(n.split(".")[0] in ("leyline_runtime", "leyline_langchain", "leyline_bench") for n in names), \
                f"{path.name} imports {names}"


def test_a_known_move_is_taken_without_a_search_and_a_wrong_one_is_searched():
    old = list(range(100))
    new = old[:30] + [500, 501] + old[40:]  # 10 tokens replaced by 2: the rest moves back by 8
    found = plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16)
    hinted = plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16, moved=(40, 32))
    assert hinted.rotated == found.rotated == RowCopy("k", 40, 32, 60, -8)
    # a hint that lands on no (long enough) run falls back to the search
    assert plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16, moved=(35, 32)).rotated == found.rotated


def test_a_window_after_the_edit_is_computed_exactly_and_the_rest_rotated():
    old = list(range(200))
    new = old[:30] + [500, 501, 502] + old[50:]
    plan = plan_turn(Snapshot("k", old), new, rotate=True, min_rotated=16, window=32)
    assert plan.prefix == 30 and plan.prefill_upto == 33 + 32
    assert plan.window == RowCopy("k", 50, 33, 32, delta=-17)  # old rows 50..81 land at 33..64, recomputed
    assert plan.rotated == RowCopy("k", 82, 65, 150 - 32, delta=-17)
    short = plan_turn(Snapshot("k", old[:90]), new[:73], rotate=True, min_rotated=16, window=32)
    assert short.rotated is None and short.window.count == 32 and short.reason  # 8 left: not worth rotating


def test_keep_caps_the_kept_prefix():
    old = list(range(100))
    plan = plan_turn(Snapshot("k", old), old[:60] + [7] + old[61:], rotate=False, min_rotated=16, keep=20)
    assert plan.prefix == 20 and plan.first == [RowCopy("k", 0, 0, 20)]
