"""``leyline-bench drift-real --vllm`` on the real Qwen2.5-Coder-0.5B: two real edits through the plugin on
servers of its own. A module of its own so that the real-model module's servers (the 0.5B, Gemma 3) are
down before these start: in fp32 (a CPU without native bf16) the three workers together took 18 GiB of a
24 GiB machine, and with one more server beside them the kernel killed a worker."""

from __future__ import annotations


def test_drift_real_inside_vllm_scores_each_mode_against_vllms_own_prefill(tmp_path):
    """``drift-real --vllm``: two real edits through the plugin (its own server). forget is vLLM's own prefill
    of the edited history, so its first greedy token is the reference's and its rows are forget's; amortize
    rotates rows and computes fewer; auto measures and decides; each question is answered by every arm.
    ``--vllm-repair 32``: a second server whose auto always keeps a 32-token exact window: amortize's rows
    plus the window, the rest still rotated."""
    import json

    from leyline_bench.cli import main

    out = tmp_path / "out"
    assert main(["drift-real", "--no-oracle", "--vllm", "2", "--edits", "2", "--greedy-tokens", "8",
                 "--answer-tokens", "8", "--vllm-repair", "32", "--out", str(out)]) == 0
    payload = json.loads((out / "drift_real.json").read_text())
    s = payload["models"]["qwen0.5b"]["vllm"]
    assert s["edits"] == 2 and s["server"]["splice"]["supported"] is True
    amortize, auto, forget = (s["arms"][m] for m in ("amortize", "auto", "forget"))
    assert forget["share"] == 1 and forget["first_token_same"] == 1 and forget["applied"] == {"forget": 2}
    assert amortize["applied"] == {"amortize": 2} and 0 < amortize["share"] < 0.5
    assert sum(auto["choices"].values()) == 2 and auto["share"] > 0
    repair = s["arms"]["repair 32"]
    assert list(s["arms"]) == ["amortize", "repair 32", "auto", "forget", "floor"]
    assert repair["applied"] == {"amortize": 2} and repair["choices"] == {"amortize": 2}
    assert amortize["share"] < repair["share"] < 1  # the window's rows computed, the rest rotated
    assert s["server"]["repair_servers"]["repair 32"]["auto_config"]["signal_window"] == 32
    assert set(s["removed"]["answered"]) == {"F", "exact", "amortize", "repair 32", "auto", "forget"}
    assert 0 <= s["arms"]["floor"]["greedy_identical"] <= 1  # vLLM's cold prefill measured beside its cached one
    assert "Leyline on vLLM" in (out / "drift_real.md").read_text()
