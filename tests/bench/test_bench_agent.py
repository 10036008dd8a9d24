"""leyline-bench agent --quick: real LangGraph agents on a served runtime, every arm's report complete."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("langchain")

from leyline_bench.agent.agent import compare, wilson
from leyline_bench.agent.tasks import LATENCIES, fit_lognormal
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


@pytest.mark.slow  # every arm on the runtime (~20 s on 2 cores): make test-slow; test-vllm runs the vLLM twin
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
    # The finished arms stay in the checkpoint after the run is written: a later --resume can add an arm.
    saved = json.loads(gzip.decompress((tmp_path / "agent.partial.samples.json.gz").read_bytes()))
    assert set(saved["arms"]) == {"append", "edits-amortize"}


def test_the_call_format_prompt_shows_a_call_the_servers_parse():
    """The example call in the prompt for models not trained on Leyline's markers is one the runtime and the
    vLLM plugin parse (leyline_sdk.tools_prompt), naming one of the tasks' tools."""
    from leyline_bench.agent.prompts import CALL_FORMAT_PROMPT, SYSTEM_PROMPTS
    from leyline_training.tools import TOOLS

    from leyline_sdk.tools_prompt import parse_assistant

    example = next(line for line in CALL_FORMAT_PROMPT.splitlines() if line.startswith("<|tool_call|>"))
    parsed = parse_assistant(example)
    assert parsed.malformed == [] and [c.function.name for c in parsed.tool_calls] == ["kv_get"]
    assert "kv_get" in {t["function"]["name"] for t in TOOLS}
    assert set(SYSTEM_PROMPTS) == {"trained", "call-format"}


def test_vllm_counters_and_prefix_cache_are_read_from_what_vllm_prints():
    from leyline_bench.agent.engines import metric_totals, prefix_caching_on

    page = ('# HELP vllm:prefix_cache_hits_total x\nvllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0\n'
            'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 64.0\n')
    assert metric_totals(page) == {"prefix_cache_queries": 1200.0, "prefix_cache_hits": 900.0, "connector_hits": 64.0}
    assert prefix_caching_on("... seed=0, enable_prefix_caching=True, enable_chunked_prefill=True") is True
    assert prefix_caching_on("no config line") is None


def test_engine_defaults_fit_the_served_model():
    import argparse

    from leyline_bench.agent.agent import engine_defaults

    from leyline_testkit.vllm_server import real_weights_dtype

    runtime = argparse.Namespace(engine="runtime", max_tokens=None, system_prompt=None, dtype=None)
    vllm = argparse.Namespace(engine="vllm", max_tokens=None, system_prompt=None, dtype=None)
    given = argparse.Namespace(engine="vllm", max_tokens=32, system_prompt="trained", dtype="float32")
    for args in (runtime, vllm, given):
        engine_defaults(args)
    assert (runtime.max_tokens, runtime.system_prompt, runtime.dtype) == (64, "trained", None)
    assert (vllm.max_tokens, vllm.system_prompt, vllm.dtype) == (128, "call-format", real_weights_dtype())
    assert (given.max_tokens, given.system_prompt, given.dtype) == (32, "trained", "float32")


def test_a_task_the_server_died_under_is_run_again_on_a_restarted_server(monkeypatch):
    import argparse

    from leyline_bench.agent import agent
    from leyline_bench.agent.run import TaskResult

    from leyline_sdk.errors import APIConnectionError

    class Served:
        url, deaths, restarts = "http://x", 1, []

        def alive(self):
            return self.deaths == 0

        def restart(self, reason):
            self.restarts.append(reason)
            self.deaths = 0

    calls = []

    def fake_run_task(url, *rest):
        calls.append(url)
        if len(calls) == 1:
            raise APIConnectionError("connection reset")
        return TaskResult("short:test-0", "short", "calc", solved=True)

    monkeypatch.setattr(agent, "run_task", fake_run_task)
    args = argparse.Namespace(max_tokens=8, max_calls=2, system_prompt="trained")
    task = type("T", (), {"task_id": "short:test-0"})()
    served = Served()
    record = agent.run_on(served, "append", task, args)
    assert record["solved"] and len(calls) == 2
    assert len(served.restarts) == 1 and "connection reset" in served.restarts[0]


def test_resume_takes_only_arms_finished_with_the_same_settings(tmp_path):
    import argparse

    from leyline_bench.agent.checkpoint import load_finished, save_finished

    def args(**changes):
        base = {"out": str(tmp_path), "resume": True, "engine": "vllm", "model": "m", "dtype": "bfloat16",
                "block_size": 32, "tasks": 2, "start": 0, "kinds": ["kv"], "max_tokens": 128, "max_calls": 8,
                "system_prompt": "call-format"}
        return argparse.Namespace(**{**base, **changes})

    save_finished(args(), {"append": {"records": [{"solved": True}], "server": {}}})
    assert set(load_finished(args())) == {"append"}
    assert load_finished(args(tasks=3)) == {} and load_finished(args(resume=False)) == {}
    assert load_finished(args(kinds=["kv", "calc"])) == {}  # other tasks: nothing to take


def test_kinds_pick_the_first_held_out_tasks_of_those_kinds_in_both_families():
    """--kinds: a model that solves only some task kinds gets a table of those (the same seeds per family)."""
    from leyline_bench.agent.tasks import TASK_KINDS, make_tasks

    picked = make_tasks(3, start=0, kinds=("kv", "calc"))
    assert [t.family for t in picked] == ["short"] * 3 + ["long"] * 3
    assert all(t.task.kind in ("kv", "calc") for t in picked)
    assert [t.task.task_id for t in picked[:3]] == [t.task.task_id for t in picked[3:]]
    assert [t.task.task_id for t in make_tasks(2)][:2] == ["test-0", "test-1"]  # no kinds: the seeds in order
    assert "kv" in TASK_KINDS and "calc" in TASK_KINDS
    with pytest.raises(ValueError, match="unknown task kinds"):
        make_tasks(1, kinds=("sql",))
