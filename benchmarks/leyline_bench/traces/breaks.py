"""What each arm would recompute per cache break of real Claude Code sessions: arithmetic, not a replay.

``benchmarks/data/kv_cache_tester/cache_breaks.json`` summarises 710 Claude Code conversations
(block hashes only, no text): a *break* is a turn whose request keeps less than all but one of
the previous request's 64-token blocks as a common prefix; its *position* is the kept share of
the previous context, its *size* the dropped tokens. The summary gives medians, not the breaks
themselves, and does not say what changed at a break: whether the old tail comes back after it
(an edit in place: a cleared or truncated tool result) or not (a compaction, a restart; the
summary counts *shrinking* breaks, whose next request is shorter, as the likely ones).

Each arm's rule, for a break at position ``P`` of a context of ``C`` tokens, whose tail of
``T = C - P`` tokens comes back unchanged after ``X`` changed tokens:

* plain vLLM (prefix cache): everything after the last whole block before the break: ``T + X``;
* llama.cpp ``--cache-reuse``: a pure deletion (``X = 0``) reuses the shifted tail: ``0``; an
  insertion or replacement recomputes from the first new token: ``T + X``;
* Leyline amortize: the changed tokens and the partial blocks at the edges: ``X + 2 * block``
  at most (block = 32 on vLLM's CPU build, 16 on CUDA);
* Leyline auto: as amortize plus its signal window (64 tokens), or ``T + X`` where it decides
  ``forget`` (its drift rule; not knowable from a summary);
* where the tail does not come back (compaction, restart), nothing is reusable after ``P``:
  every arm computes what follows.
"""

from __future__ import annotations

import json
from pathlib import Path

BREAKS_FILE = Path(__file__).resolve().parents[2] / "data" / "kv_cache_tester" / "cache_breaks.json"
VLLM_CPU_BLOCK = 32
AUTO_WINDOW = 64


def load_summary(path: Path = BREAKS_FILE) -> dict:
    return json.loads(Path(path).read_text())


def break_cases(summary: dict, sample: str = "all") -> dict:
    """The two breaks the summary describes at 100k+ contexts: the median position in the median end
    context, and the median size as measured."""
    s = summary[sample]
    context = s["end_context_tokens_median"]
    kept = s["break_kept_share_median"]
    return {
        "sample": sample, "traces": s["traces"], "breaks": s["breaks"], "transitions": s["transitions"],
        "shrinking_share": s["shrinking_breaks"] / s["breaks"] if s["breaks"] else None,
        "median_position": {"context": context, "kept_share": kept, "position": round(kept * context),
                            "tail": round((1 - kept) * context)},
        "median_size": {"tail": s["break_dropped_tokens_median"], "mean_tail": s["break_dropped_tokens_mean"]},
    }


def arm_recompute(tail: int, changed: int, block: int = VLLM_CPU_BLOCK) -> dict:
    """Tokens each arm recomputes at one break whose tail comes back after ``changed`` new tokens."""
    return {
        "vllm_plain": tail + changed,
        "llama_cpp": 0 if changed == 0 else tail + changed,
        "leyline_amortize": changed + 2 * block,
        "leyline_auto": changed + 2 * block + AUTO_WINDOW,
        "leyline_auto_if_forget": tail + changed,
    }


def table(summary: dict, changed_cases: tuple[int, ...] = (0, 10, 500)) -> dict:
    """Per case and per ``X`` (changed tokens: a pure deletion, a placeholder, a 500-token summary)."""
    out = {}
    for sample in ("all", "first_60"):
        if sample not in summary:
            continue
        cases = break_cases(summary, sample)
        rows = []
        for case in ("median_position", "median_size"):
            tail = cases[case]["tail"]
            for changed in changed_cases:
                rows.append({"case": case, "tail": tail, "changed": changed, **arm_recompute(tail, changed)})
        out[sample] = {**cases, "rows": rows}
    return out


def markdown(breaks: dict) -> list[str]:
    from ..common.output import md_table

    lines = ["## Claude Code cache breaks: what each arm would recompute (arithmetic on a summary, not a replay)", "",
             "From `benchmarks/data/kv_cache_tester/cache_breaks.json` (kv-cache-tester's block-hash traces of real "
             "Claude Code sessions; definitions in its PROVENANCE.md). The summary holds medians and does not say "
             "what changed at a break, so each row assumes the tail after the break comes back unchanged after X "
             "changed tokens (an edit in place: the best case for reuse); where it does not (compactions, "
             "restarts: the *shrinking* breaks), every arm computes what follows. Block = 32 tokens (vLLM's CPU "
             "build, as measured here).", ""]
    for sample, b in breaks.items():
        p = b["median_position"]
        lines += [f"**{sample}** ({b['traces']} traces, {b['breaks']} breaks in {b['transitions']} transitions, "
                  f"{b['shrinking_share']:.0%} of them shrinking): median break at {p['kept_share']:.0%} of the "
                  f"context; in the median end context ({p['context']:,} tokens) its tail is {p['tail']:,} tokens; "
                  f"the measured median dropped tail is {b['median_size']['tail']:,} tokens "
                  f"(mean {b['median_size']['mean_tail']:,.0f}).", ""]
        rows = [[r["case"].replace("_", " "), r["tail"], r["changed"], r["vllm_plain"], r["llama_cpp"],
                 r["leyline_amortize"], r["leyline_auto"], r["leyline_auto_if_forget"]] for r in b["rows"]]
        lines += [md_table(["break", "tail T", "changed X", "plain vLLM", "llama.cpp cache-reuse",
                            "Leyline amortize", "Leyline auto (amortized)", "Leyline auto (forget)"], rows), ""]
    return lines
