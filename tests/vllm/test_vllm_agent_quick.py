"""leyline-bench agent --engine vllm --quick: the agent bench's vLLM path end to end, on a tiny random qwen2.

Each arm gets its own ``vllm serve`` (the plugin loaded), real LangGraph agents reach it through the SDK,
and the report names every arm's server: its start, vLLM's prefix cache (on: GQA on the CPU backend) and
its counters. The random model solves nothing and calls no tool; what is checked is the path, not the
numbers. Runs in ``make test-vllm`` (about a minute a server on two busy cores).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm` (builds .venv-vllm)")
pytest.importorskip("langchain")

from leyline_bench.cli import main  # noqa: E402
from leyline_testkit.tiny_models import make_tiny_checkpoint  # noqa: E402


def test_quick_vllm_run_serves_each_arm_on_its_own_server(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "tiny-qwen2", "qwen2")
    out = tmp_path / "out"
    # the trained prompt: the tiny checkpoint's tokenizer (the runtime's) has the call markers as control
    # tokens, which the plugin refuses in message text; a real model's tokenizer does not
    assert main(["agent", "--quick", "--engine", "vllm", "--model", str(folder), "--dtype", "float32",
                 "--system-prompt", "trained", "--max-tokens", "8", "--max-calls", "2", "--out", str(out)]) == 0
    payload = json.loads((out / "agent.json").read_text())
    assert payload["engine"]["name"] == "vllm" and payload["settings"]["model"] == str(folder)
    assert set(payload["servers"]) == {"append", "edits-amortize"}
    for arm, server in payload["servers"].items():
        assert server["startup_s"] > 0 and server["prefix_caching"] is True, (arm, server)
        assert server["metrics"]["prefix_cache_queries"] > 0, (arm, server)
    for family in ("short", "long"):
        for arm in ("append", "edits-amortize"):
            a = payload["summary"][family][arm]
            assert a["tasks"] == 1 and a["errors"] == 0 and a["model_calls"] >= 1 and a["computed_tokens"] > 0
    md = (out / "agent.md").read_text()
    assert "--engine vllm" in md and "## Servers" in md and "vllm serve + Leyline plugin" in md
    assert (out / "agent.png").stat().st_size > 0 and (out / "agent.samples.json.gz").is_file()
