"""The transformers oracle of ``leyline-bench drift``: its splice is the connectors' (layer-0 rows of moved tokens
equal a fresh prefill's; unrotated or wrongly paired they do not; on MLA, Llama and Qwen2, whose keys carry a
q/k/v bias), forget is a fresh prefill, and the quick run reports every policy for an MLA and a GQA model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_bench_smoke import run_bench

from leyline_bench.drift.drift import load_model
from leyline_bench.drift.drift_oracle import cat, moved, prefill, rope_slot, take


@pytest.fixture(scope="module", params=["default", "random-llama", "random-qwen2"])
def model(request):
    torch.manual_seed(0)
    return load_model(request.param)


def _moved_rows(model, slot, delta_seen):
    """History a + [x] + b, edited to a + [y, y, y] + b: b's layer-0 rows, spliced with ``delta_seen`` vs fresh."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(10, 8000, (40,), generator=g).tolist(), torch.randint(10, 8000, (60,), generator=g).tolist()
    old, new = a + [5], a + [7, 7, 7]
    _, rows = prefill(model, old + b, 0, [])
    _, fresh = prefill(model, new + b, 0, [])
    tail = moved(take(rows, len(old), len(old) + len(b)), delta_seen, slot)
    _, repl = prefill(model, new[len(a):], len(a), take(rows, 0, len(a)))
    spliced = cat(take(rows, 0, len(a)), repl, tail)
    t = slot.tensor
    return spliced[0][t][:, len(new):], fresh[0][t][:, len(new):]


def test_splice_matches_a_fresh_prefill_at_layer0_and_controls_fail(model):
    slot = rope_slot(model)
    got, want = _moved_rows(model, slot, 2)
    rot = slice(slot.offset, slot.offset + slot.dim)
    scale = want[..., rot].abs().max()
    assert (got[..., rot] - want[..., rot]).abs().max() <= 1e-4 * scale
    assert torch.equal(got[..., slot.offset + slot.dim:], want[..., slot.offset + slot.dim:])
    unrotated, _ = _moved_rows(model, slot, 0)
    assert (unrotated[..., rot] - want[..., rot]).abs().max() > 0.05 * scale
    wrong, _ = _moved_rows(model, replace(slot, pair_layout="interleaved"), 2)
    assert (wrong[..., rot] - want[..., rot]).abs().max() > 0.05 * scale


@pytest.mark.slow  # drift --quick on two models (~12 s on 2 cores): make test-slow
def test_quick_run_scores_every_policy_on_mla_and_gqa(tmp_path):
    p = run_bench(tmp_path, "drift")
    assert set(p["models"]) == {"mla-default", "random-llama"}
    for m in p["models"].values():
        s = m["summary"]
        assert s["forget_vs_fresh_max_jsd"] < 1e-8 and s["layer0_rotary_max_rel_err"] < 1e-3
        assert s["forget"]["share"] == 1 and 0 < s["amortize"]["share"] < 0.2
        assert s["amortize"]["next_jsd_p90"] > s["forget"]["next_jsd_p90"]
        assert sum(s["auto"]["choices"].values()) == p["settings"]["edits"]
    assert p["models"]["random-llama"]["kv_heads"] == 2
