"""A headline figure quoted in several documents says the same everywhere, and what its run says.

``docs/perf/headline.json`` pins each figure that README.md and docs/ quote in more than one place: the
value as the documents print it and the run (a JSON file under docs/perf/) it comes from. Here each
pinned value is recomputed from its run, and every quote of it found in the documents must equal it:
a document that rounds differently, or still quotes an older run, fails with its name and the quote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADLINE = ROOT / "docs" / "perf" / "headline.json"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "perf" / "gpu" / "README.md"]
FIGURES: dict[str, dict[str, str]] = json.loads(HEADLINE.read_text())["figures"]

_NOT_A_TARGET = r"(?<![≥≤] )(?<!within )"  # "≥ 3× fewer ...", "within 1.3× of the floor": a target, not a result

# How the documents write each figure: every match is a quote; its groups, joined as _JOINED says, are the value.
QUOTES: dict[str, list[str]] = {
    "prompt_tokens_vs_plain_vllm": [_NOT_A_TARGET + r"\b(\d+\.\d+)× fewer (?:prompt tokens )?than plain vLLM"],
    "prompt_tokens_over_the_floor": [_NOT_A_TARGET + r"\b(\d+\.\d+)× (?:of )?the floor"],
    "prompt_tokens_vs_llama_cpp": [r"\b(\d+\.\d+)× fewer (?:prompt tokens )?than llama\.cpp"],
    "gpu_kernel_share_of_copy_bandwidth": [r"\b(\d+)–(\d+)% of the device's own copy",
                                           r"\b(\d+)% / \d+% / (\d+)%\** of the device's own copy"],
    "edit_speedup_vs_forget": [r"\b(\d+)× vs forget"],
    "edit_speedup_vs_transformers": [r"\b(\d+)× vs (?:peer|transformers)"],
    "fidelity_jsd_ratio": [_NOT_A_TARGET + r"\b(\d+)× (?:below|over all \d+ cases)"],
    "vllm_ttft_speedup_block32": [r"\b(\d+\.\d+)× / (\d+\.\d+)× / (\d+\.\d+)×,? (?:and )?forget 1\.02"],
}


def _traces_amortize(run: dict[str, Any]) -> dict[str, Any]:
    return next(row for row in run["summary"] if row["model"] == "qwen2.5-coder-0.5b"
                and row["policy"] == "langchain_clear" and row["arm"] == "leyline_amortize")


def _gpu_kernel_share(run: dict[str, Any]) -> str:
    bandwidth = next(step for step in run["steps"] if step["name"] == "bandwidth")
    shares = [round(100 * cell["gb_per_s"]["triton_kernel"] / bandwidth["device_copy_gb_per_s"])
              for cell in bandwidth["cells"] if cell["tokens"] == 32768]
    return f"{min(shares)}–{max(shares)}"


def _edit_ratio(run: dict[str, Any], arm: str) -> str:
    cell = next(c for c in run["cells"] if c["context"] == 4096 and c["position"] == 0.1 and c["span"] == "message")
    return f"{cell['ratio_to_amortize'][arm]:.0f}"


_JOINED = {1: "", 2: "–", 3: " / "}  # one number; a lowest–highest range; one value per edit position


# Each figure as its run computes it, printed as the documents print it.
FROM_RUN: dict[str, Callable[[dict[str, Any]], str]] = {
    "prompt_tokens_vs_plain_vllm": lambda run: f"{_traces_amortize(run)['plain_over_arm_tokens']:.2f}",
    "prompt_tokens_over_the_floor": lambda run: f"{_traces_amortize(run)['computed_over_floor']:.2f}",
    "prompt_tokens_vs_llama_cpp": lambda run: f"{_traces_amortize(run)['llama_over_arm_tokens']:.2f}",
    "gpu_kernel_share_of_copy_bandwidth": _gpu_kernel_share,
    "edit_speedup_vs_forget": lambda run: _edit_ratio(run, "forget"),
    "edit_speedup_vs_transformers": lambda run: _edit_ratio(run, "peer"),
    "fidelity_jsd_ratio": lambda run: f"{run['summary']['overall']['all']['jsd_n_over_l']:.0f}",
    "vllm_ttft_speedup_block32": lambda run: " / ".join(f"{edit['amortize']['speedup_vs_resend']:.3g}"
                                                        for edit in run["edits"]),
}


def quotes_of(name: str, text: str) -> list[str]:
    """Every quote of figure ``name`` in ``text``, as the value it states (a quote may wrap a line)."""
    text = " ".join(text.split())
    return [_JOINED[len(m.groups())].join(m.groups()) for pattern in QUOTES[name] for m in re.finditer(pattern, text)]


def test_every_pinned_figure_has_its_quotes_and_its_run():
    assert set(FIGURES) == set(QUOTES) == set(FROM_RUN)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_the_pinned_figure_is_what_its_run_says(name):
    figure = FIGURES[name]
    run = json.loads((ROOT / figure["run"]).read_text())
    assert FROM_RUN[name](run) == figure["quoted"], f"{name}: {figure['run']} says otherwise: update headline.json"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_document_quotes_the_pinned_figure(name):
    pinned = FIGURES[name]["quoted"]
    quoted_in = {}
    for document in DOCUMENTS:
        found = quotes_of(name, document.read_text())
        if found:
            quoted_in[str(document.relative_to(ROOT))] = found
    wrong = {doc: found for doc, found in quoted_in.items() if set(found) != {pinned}}
    assert not wrong, f"{name} is {pinned} (docs/perf/headline.json), but these quote otherwise: {wrong}"
    assert len(quoted_in) >= 2, f"{name} is quoted only in {list(quoted_in)}: it needs no pin"


def test_a_quote_that_differs_is_found():
    text = ("amortize computes ≥ 3× fewer prompt tokens than plain vLLM, within 1.3× of the floor: "
            "1.8× fewer than plain vLLM, 1.07× the floor; the kernel alone 82% / 87% / 96% of the device's own\ncopy")
    assert quotes_of("prompt_tokens_vs_plain_vllm", text) == ["1.8"]
    assert quotes_of("prompt_tokens_over_the_floor", text) == ["1.07"]
    assert quotes_of("gpu_kernel_share_of_copy_bandwidth", text) == ["82–96"]
    assert quotes_of("vllm_ttft_speedup_block32", "12.9× / 6.4× / 5.77×, forget 1.02–1.06×") == ["12.9 / 6.4 / 5.77"]
