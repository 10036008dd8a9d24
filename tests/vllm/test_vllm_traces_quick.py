"""``leyline-bench traces --quick``: 2 real sessions under LangChain's ``ClearToolUsesEdit`` on a tiny random
Qwen3 (nothing downloaded), every arm on its own server: plain vLLM, Leyline amortize and auto, llama.cpp
(on the same weights as a GGUF, when ``make llama-server`` built it) and the bundled runtime; about 4 min
on 2 cores. The report holds every number it promises, and the numbers hang together."""

from __future__ import annotations

import gzip
import json

from leyline_bench.cli import main
from leyline_bench.common.llama_server import LLAMA_SERVER

VLLM_ARMS = ("vllm_plain", "leyline_amortize", "leyline_auto")
FIELDS = ("turns", "edited_turns", "computed", "prompt", "floor", "computed_over_floor", "ttft_p50_s", "ttft_p95_s",
          "ttft_sum_s", "plain_over_arm_tokens", "llama_over_arm_tokens", "prompt_mismatches")


def test_quick_traces_report(tmp_path):
    out = tmp_path / "out"
    code = main(["traces", "--quick", "--out", str(out), "--workdir", str(tmp_path / "work")])
    payload = json.loads((out / "traces.json").read_text())
    assert code == 0
    llama = LLAMA_SERVER.is_file()
    tiny = payload["models"]["tiny-qwen3"]
    assert tiny["arms"] == ([*VLLM_ARMS, "llama_cpp"] if llama else list(VLLM_ARMS))
    if not llama:
        assert "absent" in tiny["skipped"]["llama_cpp"]
    assert payload["models"]["runtime"]["arms"] == ["runtime"]

    rows = {(s["model"], s["arm"]): s for s in payload["summary"]}
    assert set(rows) == {("tiny-qwen3", a) for a in tiny["arms"]} | {("runtime", "runtime")}
    assert [s["calls"] for s in payload["sessions"]] and all(s["calls"] >= 2 for s in payload["sessions"])
    for key, s in rows.items():
        assert all(f in s for f in FIELDS), key
        assert s["policy"] == "langchain_clear" and s["turns"] == sum(x["calls"] for x in payload["sessions"]), key
        assert s["prompt_mismatches"] == 0, key  # every arm of a model computed over the same prompt ids
        assert 0 < s["floor"] <= s["prompt"] and s["computed"] > 0 and s["ttft_p50_s"] > 0, key

    plain, amortize = rows[("tiny-qwen3", "vllm_plain")], rows[("tiny-qwen3", "leyline_amortize")]
    assert plain["edited_turns"] >= 1  # the clearing happened, so the arms differ where it matters
    assert plain["computed"] >= plain["floor"]  # a prefix cache reuses at most the common prefix
    # plain vLLM (a fresh server of its own, a pool far larger than these prompts: nothing evicted) computes what
    # the arithmetic prefix cache of 32-token blocks counts, token for token: what traces-bound relies on
    assert plain["computed"] == payload["prefix_cache_arithmetic"]["tiny-qwen3/langchain_clear"]
    assert amortize["computed_edited"] < plain["computed_edited"]  # the cleared output's tail is not recomputed
    assert amortize["plain_over_arm_tokens"] == plain["computed"] / amortize["computed"]
    if llama:
        assert amortize["llama_over_arm_tokens"] == rows[("tiny-qwen3", "llama_cpp")]["computed"] / amortize["computed"]
    for run in payload["runs"]:
        assert run["load_average_before"] and run["server"]["startup_s"] > 0, run["arm"]

    assert {t["target"] for t in payload["targets"]} and payload["cache_breaks"]["all"]["rows"]
    samples = json.loads(gzip.decompress((out / payload["samples_file"]).read_bytes()))
    turns = samples["turns"]["tiny-qwen3/langchain_clear/vllm_plain"]
    assert len(turns) == plain["turns"] and sum(t["computed"] for t in turns) == plain["computed"]

    markdown = (out / "traces.md").read_text()
    assert "`leyline-bench traces --quick" in markdown and "## tiny-qwen3" in markdown and "## runtime" in markdown
    assert "## Targets" in markdown and "## Claude Code cache breaks" in markdown
    assert "| langchain_clear | leyline_amortize |" in markdown
    for png in ("traces_per_turn_langchain_clear.png", "traces_over_floor.png", "traces_ttft_p50.png"):
        assert (out / png).stat().st_size > 0
