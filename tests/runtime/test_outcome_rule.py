"""leyline_runtime.outcome_rule: which mode each edit of a batch was applied in, and why (both engines)."""

from leyline_runtime.outcome_rule import (
    AFTER_FORGET,
    ERASE,
    ONE_RUN_PER_BATCH,
    UNSUPPORTED_RUNTIME,
    Applied,
    applied_modes,
    erased_auto,
    planned_mode,
)
from leyline_sdk.protocol import AutoDecision


def test_an_amortize_before_a_forget_keeps_its_mode_and_one_after_it_does_not():
    assert applied_modes(["amortize", "forget", "amortize", "auto"]) == [
        Applied("amortize"), Applied("forget"), Applied("forget", AFTER_FORGET), Applied("forget", AFTER_FORGET)]


def test_an_engine_that_cannot_rotate_forgets_from_the_first_edit_on():
    got = applied_modes(["forget", "amortize"], moves_rows=[True, True], unsupported="why")
    assert got == [Applied("forget"), Applied("forget", AFTER_FORGET)]
    got = applied_modes(["amortize", "auto", "amortize"], moves_rows=[True, True, False], unsupported="why")
    assert got == [Applied("forget", f"{UNSUPPORTED_RUNTIME}: why"), Applied("forget", AFTER_FORGET),
                   Applied("forget", AFTER_FORGET)]


def test_rows_recomputed_after_one_edit_demote_that_edit_only():
    got = applied_modes(["amortize", "amortize"], recomputed={0: ONE_RUN_PER_BATCH})
    assert got == [Applied("forget", ONE_RUN_PER_BATCH), Applied("amortize")]


def test_a_batch_recomputed_whole_is_forget_everywhere_with_its_reason():
    assert applied_modes(["forget", "amortize"], recomputed_all="kv_load_failed: x") == [
        Applied("forget", "kv_load_failed: x"), Applied("forget", "kv_load_failed: x")]


def test_an_edit_with_nothing_after_it_is_applied_as_asked():
    assert applied_modes(["amortize"], moves_rows=[False], unsupported="why") == [Applied("amortize")]


def test_an_erase_is_forget_whatever_was_asked_and_what_follows_it_too():
    got = applied_modes(["amortize", "auto", "amortize"], intents=["shrink", "erase", "shrink"])
    assert got == [Applied("amortize"), Applied("forget", ERASE), Applied("forget", AFTER_FORGET)]
    assert applied_modes(["forget"], intents=["erase"]) == [Applied("forget")]  # asked for, nothing to name


def test_the_planned_mode_of_an_erase_is_forget_and_auto_names_why():
    assert [planned_mode(m, "erase") for m in ("amortize", "auto", "forget")] == ["forget"] * 3
    assert [planned_mode(m, "shrink") for m in ("amortize", "auto", "forget")] == ["amortize", "auto", "forget"]
    assert erased_auto("auto", ERASE) == AutoDecision(choice="forget", reason=ERASE)
    assert erased_auto("amortize", ERASE) is None and erased_auto("auto", AFTER_FORGET) is None
