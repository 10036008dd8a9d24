"""Every ``leyline-bench`` subcommand runs with ``--quick`` on tiny inputs and writes sane results.

No wall-clock assertions: only that the files exist, the JSON has the
expected keys, and every count/time/rate in it is a non-negative number.
"""

import json

import pytest
import torch
from helpers import agent_history

from leyline_bench.cli import main
from leyline_sdk.protocol import Directive, Span

pytest.importorskip("matplotlib")

SIGNED_KEYS = {"delta", "deltas", "expected_delta"}  # token deltas may be negative


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def numbers(value, key=None):
    if isinstance(value, bool) or key in SIGNED_KEYS:
        return
    if isinstance(value, (int, float)):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v, key)


def run_bench(tmp_path, name, *extra, file=None) -> dict:
    out = tmp_path / "out"
    assert main([name, "--quick", "--threads", "1", "--out", str(out), *extra]) == 0
    payload = json.loads((out / f"{file or name}.json").read_text())
    assert (out / f"{file or name}.md").read_text().startswith(f"# leyline-bench {name}")
    assert list(out.glob("*.png")), "no plot written"
    for key in ("machine", "command", "git", "benchmark"):
        assert key in payload
    assert payload["command"].startswith(f"leyline-bench {name} --quick")
    assert {"cpu", "cores", "torch", "threads"} <= payload["machine"].keys()
    negative = [(k, v) for k, v in numbers(payload) if v < 0]
    assert not negative, negative
    return payload


def test_edit(tmp_path):
    p = run_bench(tmp_path, "edit", "--contexts", "480", "9000")
    (cell,) = p["cells"]
    assert cell["context"] == 480
    assert {"amortize", "forget", "full", "copy", "peer_full", "peer_crop", "peer"} <= cell["median_s"].keys()
    assert {"forget", "full", "peer"} <= cell["ratio_to_amortize"].keys()
    assert cell["edit"]["applied_mode"] == "amortize"
    assert [s["context"] for s in p["skipped"]] == [9000]


def test_prefill(tmp_path):
    p = run_bench(tmp_path, "prefill")
    (cell,) = p["cells"]
    assert cell["context"] == 256 and cell["dtype"] == "float32"
    assert cell["tokens_per_s"]["leyline"] > 0 and cell["tokens_per_s"]["peer"] > 0
    assert cell["speedup_vs_peer"] == cell["median_s"]["peer"] / cell["median_s"]["leyline"]


@pytest.mark.slow  # the GEMM bench on every backend (~15 s on 2 cores): make test-slow
def test_gemm(tmp_path):
    p = run_bench(tmp_path, "gemm")
    assert [c["rows"] for c in p["cells"]] == [1, 16]
    assert p["auto_choice"] in ("blas", "onednn")
    for c in p["cells"]:
        assert c["speedup_onednn"] == c["median_s"]["blas"] / c["median_s"]["onednn"]
        assert max(c["max_relative_error"].values()) < 1e-5  # both are fp32 products


def test_kernel(tmp_path):
    p = run_bench(tmp_path, "kernel", "--rows", "1024", "--reps", "2")
    assert {r["dtype"] for r in p["results"]} == {"float32", "bfloat16"}
    for r in p["results"]:
        assert {"copy", "torch"} <= r["gb_per_s"].keys()
        assert r["torch_vs_copy"] > 0
    if not torch.cuda.is_available():
        assert p["triton"] == "skipped: no GPU"


def _tiny_workload(path):
    history = agent_history(long_output_lines=4)[:-1]
    dump = [m.model_dump(exclude_none=True) for m in history]
    drop = Directive(span=Span(start=2, end=4)).model_dump()
    clear = Directive(span=Span(start=7, end=8),
                      replacement=[history[7].model_copy(update={"content": "[cleared]"})]).model_dump()
    cases = [
        {"name": "drop", "category": "drop_failed_attempt", "history": dump, "directives": [drop], "target": "8097"},
        {"name": "drift", "category": "multi_edit_drift", "group": "k=2", "history": dump,
         "edits": [[clear], [drop]]},
    ]
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))


def test_fidelity(tmp_path):
    workload = tmp_path / "w.jsonl"
    _tiny_workload(workload)
    p = run_bench(tmp_path, "fidelity", "--workload", str(workload))
    assert len(p["cases"]) == 2
    overall = p["summary"]["overall"]
    assert overall["all"]["cases"] == 2
    assert overall["admitted"]["cases"] + overall["not_admitted"]["cases"] == 2
    assert {"multi_edit_drift k=2"} <= p["summary"]["groups"].keys()
    for case in p["cases"]:
        assert {"jsd_r_l", "jsd_r_n", "top1_l", "top10_l", "greedy_divergence", "admitted", "reason"} <= case.keys()
    assert len(p["cases"][1]["deltas"]) == 2  # two sequential batches


def _tiny_traces(path):
    h = [m.model_dump(exclude_none=True) for m in agent_history(long_output_lines=6)]
    for i, m in enumerate(h):
        m["id"] = f"m{i}"
    cleared = [dict(m, content="[cleared]") if i == 7 else m for i, m in enumerate(h)]
    trace = {"name": "tiny", "pattern": "clear_tool_uses", "turns": [h[:2], h[:8], cleared[:10]]}
    path.write_text(json.dumps(trace) + "\n")


def test_replay(tmp_path):
    traces = tmp_path / "t.jsonl"
    _tiny_traces(traces)
    p = run_bench(tmp_path, "replay", "--traces", str(traces))
    overall = p["summary"]["overall"]
    assert set(overall) == {"no_cache", "prefix_cache", "leyline_amortize", "leyline_forget"}
    assert overall["no_cache"]["cache_hit_pct"] == 0
    for block in overall.values():
        assert block["reused_tokens"] + block["prefilled_tokens"] == block["prompt_tokens"]
        assert 0 <= block["cache_hit_pct"] <= 100
    assert overall["leyline_amortize"]["reused_tokens"] > overall["prefix_cache"]["reused_tokens"]
    assert p["evictions"] == 0


@pytest.mark.slow  # the serve bench end to end (~12 s on 2 cores): make test-slow
def test_serve(tmp_path):
    pytest.importorskip("uvicorn")
    p = run_bench(tmp_path, "serve")
    assert p["errors"] == 0
    assert [lv["sessions"] for lv in p["levels"]] == [1, 2]
    for level in p["levels"]:
        assert level["loops"] == level["sessions"]
        assert {"POST /sessions", "POST /sessions/{id}/generate", "POST /directives"} <= level["latency_s"].keys()
        for q in level["latency_s"].values():
            assert q["p50"] <= q["p95"] <= q["p99"]
        decode = level["decode"]
        assert decode["requests"] == level["sessions"] and decode["completion_tokens"] >= level["sessions"]
        assert decode["ttft_s"]["p50"] <= decode["latency_s"]["p50"]
        engine = decode["engine"]  # the runtime's leyline_engine_* counters around the decode phase
        assert engine["decode"]["steps"] >= 1 and 1 <= engine["decode"]["mean_sequences"] <= level["sessions"]
        assert engine["prefill"]["steps"] + engine["mixed"]["steps"] >= 1  # each turn's new message
        assert 0 < engine["busy_share"]


@pytest.mark.slow  # the chaos bench end to end (~13 s on 2 cores): make test-slow
def test_chaos(tmp_path):
    p = run_bench(tmp_path, "chaos")
    assert p["server_errors"] == 0 and p["valid_failed"] == 0 and p["healthy_after"]
    assert p["requests"] == p["valid_requests"] + p["invalid_requests"] > 0
    assert all(status.startswith("invalid 4") or status.startswith("valid 2") for status in p["status_codes"])
    assert p["rss_bytes"]["before"] > 0 and p["rss_bytes"]["after"] > 0


def test_traces_bound(tmp_path):
    p = run_bench(tmp_path, "traces-bound", file="traces_bound")
    rows = {(r["policy"], r["cap"]): r for r in p["rows"]}
    assert set(rows) == {(pol, cap) for pol in ("langchain_clear", "ten_line_truncation") for cap in (4096, 8192)}
    for r in rows.values():
        assert r["floor"] <= r["prefix_cache"] <= r["prompt"]
    cleared = rows[("langchain_clear", 8192)]
    assert cleared["edited_calls"] >= 1 and cleared["prefix_edited"] > cleared["floor_edited"]
    assert (tmp_path / "out" / "traces_bound.png").is_file()
