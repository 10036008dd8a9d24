"""``leyline-bench portability --quick`` on one spliced and one refused family (two ``vllm serve``
starts, about 2 min on 2 cores): the JSON has every number of the matrix, the markdown its rows."""

from __future__ import annotations

import json
from pathlib import Path

from leyline_bench.cli import main
from leyline_bench.vllm.vllm import POSITIONS
from tolerances import TOLERANCE

POSITIONS_KEYS = [str(p) for p in POSITIONS]  # the JSON keys of the 10/50/90% cells
DRIFT_JSON = Path(__file__).resolve().parents[2] / "docs" / "perf" / "drift.json"  # leyline-bench drift's, committed


def test_quick_portability_matrix(tmp_path):
    out = tmp_path / "out"
    code = main(["portability", "--quick", "--families", "qwen3,gpt_oss", "--out", str(out),
                 "--workdir", str(tmp_path / "work"), "--drift", str(DRIFT_JSON)])
    payload = json.loads((out / "portability.json").read_text())
    families = payload["families"]
    assert code == 0 and payload["failed"] == [] and list(families) == ["qwen3", "gpt_oss"], payload.get("failed")
    for name, fam in families.items():
        assert fam.get("error") is None, (name, fam.get("error"))
        tol = TOLERANCE[fam["engine"]["dtype"]].logprob
        assert fam["forget"]["same_tokens"] and fam["forget"]["max_logprob_diff"] <= tol, (name, fam["forget"])
        for arm in ("amortize_vs_resend", "forget_vs_resend"):
            assert list(fam["ttft"][arm]) == POSITIONS_KEYS and all(v > 0 for v in fam["ttft"][arm].values())

    spliced, refused = families["qwen3"], families["gpt_oss"]
    assert spliced["splice"]["supported"] and spliced["splice"]["pair_layout"] == "half_split"
    dtype = spliced["engine"]["dtype"]
    assert spliced["rotation"]["applied_mode"] == "amortize" and spliced["rotation"]["rotated_tokens"] > 0
    assert spliced["rotation"]["rotary_max_err"] <= TOLERANCE[dtype].rotary
    assert spliced["rotation"]["other_max_err"] <= TOLERANCE[dtype].other
    assert spliced["ttft"]["amortize_applied"] == ["amortize"]

    assert not refused["splice"]["supported"] and "sliding-window" in refused["splice"]["reason"]
    assert refused["rotation"]["applied_mode"] == "forget" and refused["rotation"]["rotary_max_err"] is None
    assert refused["rotation"]["fallback_reason"].startswith("unsupported_runtime: ")
    assert refused["ttft"]["amortize_applied"] == ["forget"]

    markdown = (out / "portability.md").read_text()
    assert "`leyline-bench portability --quick" in markdown and "docs/perf/vllm_shapes" in markdown
    assert "| `qwen3` | spliced (RotaryEmbedding) | half_split, 128/128 |" in markdown
    assert "| `gpt_oss` | refused |" in markdown
    # the trained models' fidelity, read from the drift bench's JSON
    assert set(payload["fidelity"]["models"]) == set(json.loads(DRIFT_JSON.read_text())["models"])
    assert "## Amortize fidelity on trained models" in markdown and "| `llama-gqa` | llama (6 / 2) |" in markdown
