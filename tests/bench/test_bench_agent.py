"""leyline-bench agent --quick: real LangGraph agents on a served runtime, every arm's report complete."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langchain")

from leyline_bench.agent import compare, wilson
from leyline_bench.agent_tasks import LATENCIES, fit_lognormal
from leyline_bench.cli import main


def test_the_latency_fit_meets_its_figures():
    from statistics import NormalDist

    mu, sigma = fit_lognormal()
    dist = NormalDist(mu, sigma)
    assert dist.cdf(0.0) == pytest.approx(0.86) and dist.cdf(2.302585) == pytest.approx(0.95)
    assert LATENCIES["none"].sampler("x")() == 0.0


def test_wilson_and_ties():
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    by_arm = {"a": {"solve_rate_95": list(wilson(9, 10))}, "b": {"solve_rate_95": list(wilson(1, 10))},
              "c": {"solve_rate_95": list(wilson(6, 10))}}
    assert compare(by_arm, "a", "b") == "a > b" and compare(by_arm, "a", "c") == "tie"


def test_quick_run_writes_every_arm(tmp_path):
    assert main(["agent", "--quick", "--threads", "1", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "agent.json").read_text())
    assert (tmp_path / "agent.png").stat().st_size > 0
    md = (tmp_path / "agent.md").read_text()
    assert "leyline-bench agent --quick" in md and "CPU:" in md
    for family in ("short", "long"):
        for arm in ("append", "edits-amortize"):
            a = payload["summary"][family][arm]
            assert a["tasks"] == 1 and a["model_calls"] >= 1 and a["computed_tokens"] > 0
            assert a["ttft_s"]["p50"] is not None and a["wall_s"]["sampled"] >= a["wall_s"]["none"]
    # Task seed 1 reads files: with the log tails, append-only overflows the context; the edits keep it inside.
    long = payload["summary"]["long"]
    assert long["append"]["overflows"] == 1
    assert long["edits-amortize"]["overflows"] == 0 and long["edits-amortize"]["modes"].get("amortize", 0) >= 1
