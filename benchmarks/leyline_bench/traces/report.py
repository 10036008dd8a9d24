"""``leyline-bench traces``' report: per (model, policy, arm) totals beside the floor, ratios, TTFT,
the targets, the cache-break arithmetic, plots; per-turn records go to the samples file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..common.output import fmt, md_table, write_results
from .breaks import load_summary
from .breaks import markdown as breaks_markdown
from .arms import VLLM_BLOCK_SIZE
from .breaks import table as breaks_table

TARGET_POLICY = "langchain_clear"
REAL_MODEL, SHAPE_MODEL = "qwen2.5-coder-0.5b", "qwen3-1.7b-shape"


def percentile(values: list[float], share: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[round(share * (len(ordered) - 1))]


def summarise(turns: list[dict]) -> dict:
    edited = [t for t in turns if t["edited"]]
    latencies = [t["latency_s"] for t in turns]
    prefill = [t["prefill_s"] for t in turns if t.get("prefill_s") is not None]
    out = {"sessions": len({t["session"] for t in turns}), "turns": len(turns), "edited_turns": len(edited),
           "computed": sum(t["computed"] for t in turns), "prompt": sum(t["prompt"] for t in turns),
           "floor": sum(t["floor"] for t in turns),
           "computed_edited": sum(t["computed"] for t in edited), "floor_edited": sum(t["floor"] for t in edited),
           "ttft_p50_s": percentile(latencies, 0.5), "ttft_p95_s": percentile(latencies, 0.95),
           "ttft_sum_s": sum(latencies), "prefill_s": sum(prefill) if len(prefill) == len(turns) else None,
           "prompt_mismatches": sum(t["prompt"] != t["expected_prompt"] for t in turns)}
    out["computed_over_floor"] = out["computed"] / out["floor"] if out["floor"] else None
    outcomes = [o for t in turns for o in t.get("outcomes") or []]
    out["auto_choices"] = dict(Counter((o.get("auto") or {}).get("choice") for o in outcomes if o.get("auto")))
    out["fallbacks"] = dict(Counter(o["fallback_reason"].split(":")[0] for o in outcomes if o.get("fallback_reason")))
    if any("client_cleared" in t for t in turns):
        out["server_edit_mismatches"] = sum(t["client_cleared"] != t.get("cleared_tool_uses") for t in turns)
    return out


def add_ratios(summaries: dict) -> None:
    """``plain / arm`` and ``llama.cpp / arm`` (tokens and TTFT p50), on the same model and policy."""
    for (model, policy, arm), s in summaries.items():
        for peer, key in (("vllm_plain", "plain"), ("llama_cpp", "llama")):
            other = summaries.get((model, policy, peer))
            s[f"{key}_over_arm_tokens"] = other["computed"] / s["computed"] if other and s["computed"] else None
            s[f"{key}_over_arm_ttft_p50"] = (other["ttft_p50_s"] / s["ttft_p50_s"]
                                             if other and s["ttft_p50_s"] else None)


def targets(summaries: dict) -> list[dict]:
    def get(model, arm, key):
        s = summaries.get((model, TARGET_POLICY, arm))
        return None if s is None else s[key]

    checks = [
        ("Leyline amortize computes >= 3x fewer prompt tokens than plain vLLM", REAL_MODEL,
         get(REAL_MODEL, "leyline_amortize", "plain_over_arm_tokens"), 3.0, ">="),
        ("Leyline amortize within 1.3x of the floor", REAL_MODEL,
         get(REAL_MODEL, "leyline_amortize", "computed_over_floor"), 1.3, "<="),
        ("Leyline amortize TTFT p50 >= 2x better than plain vLLM", SHAPE_MODEL,
         get(SHAPE_MODEL, "leyline_amortize", "plain_over_arm_ttft_p50"), 2.0, ">="),
        ("Leyline amortize recomputes no more than llama.cpp's cache reuse (llama.cpp / amortize >= 1)", REAL_MODEL,
         get(REAL_MODEL, "leyline_amortize", "llama_over_arm_tokens"), 1.0, ">="),
    ]
    out = []
    for name, model, value, bound, sense in checks:
        met = None if value is None else (value >= bound if sense == ">=" else value <= bound)
        out.append({"target": name, "policy": TARGET_POLICY, "model": model, "value": value, "bound": bound,
                    "met": met})
    return out


def report(out: str | Path, result: dict, samples: dict) -> dict:
    summaries = {}
    for key, turns in samples.items():
        summaries[tuple(key.split("/"))] = summarise(turns)
    add_ratios(summaries)
    result["summary"] = [{"model": m, "policy": p, "arm": a, **s} for (m, p, a), s in summaries.items()]
    result["targets"] = targets(summaries)
    result["cache_breaks"] = breaks_table(load_summary())
    body = markdown(result)
    payload = write_results(out, "traces", result, "Real agent sessions through real history policies",
                            body, samples={"turns": samples})
    plot(Path(out), result, samples)
    return payload


def markdown(result: dict) -> str:
    lines = [_what_ran(result), ""]
    for model, info in result["models"].items():
        lines += [f"## {model}", "", info["description"] + ".", ""]
        if info["skipped"]:
            lines += ["Not run on it: " + "; ".join(f"`{a}` ({why})" for a, why in info["skipped"].items()) + ".", ""]
        rows = [_row(s) for s in result["summary"] if s["model"] == model]
        lines += [md_table(["policy", "arm", "turns (edited)", "computed", "floor", "computed / floor",
                            "plain ÷ arm", "llama.cpp ÷ arm", "edited turns: computed / floor", "TTFT p50 s",
                            "TTFT p95 s", "prefill s (engine)", "TTFT sum s"], rows), ""]
        arithmetic = {k.split("/")[1]: v for k, v in result.get("prefix_cache_arithmetic", {}).items()
                      if k.split("/")[0] == model}
        if arithmetic:
            lines += [f"By arithmetic on the same calls, a prefix cache of {VLLM_BLOCK_SIZE}-token blocks matched "
                      "against the previous request (`traces/floor.py`, what `traces-bound` counts) computes: "
                      + "; ".join(f"`{p}` {v:,}" for p, v in arithmetic.items()) + ".", ""]
    lines += ["## Targets (policy `langchain_clear`)", "",
              md_table(["target", "model", "measured", "bound", "met"],
                       [[t["target"], t["model"], t["value"], t["bound"], t["met"]] for t in result["targets"]]), ""]
    lines += breaks_markdown(result["cache_breaks"])
    lines += ["## Policies (parameters as run)", ""]
    lines += [f"* `{name}`: " + ", ".join(f"{k} = {v}" for k, v in params.items())
              for name, params in result["policies"].items()]
    return "\n".join(lines)


def _row(s: dict) -> list:
    edited = f"{s['computed_edited']} / {s['floor_edited']}" if s["edited_turns"] else "–"
    return [s["policy"], s["arm"], f"{s['turns']} ({s['edited_turns']})", s["computed"], s["floor"],
            s["computed_over_floor"], s["plain_over_arm_tokens"], s["llama_over_arm_tokens"], edited,
            s["ttft_p50_s"], s["ttft_p95_s"], s["prefill_s"], s["ttft_sum_s"]]


def _what_ran(result: dict) -> str:
    sessions = result["sessions"]
    calls = sum(s["calls"] for s in sessions)
    runs = result["runs"]
    loads = [r["load_average_before"][0] for r in runs] + [r["load_average_after"][0] for r in runs]
    limit = "" if result["max_turns"] is None else f", at most {result['max_turns']} per session"
    return (f"Measured by `{result.get('run_command')}`. {len(sessions)} held-out mini-swe-agent sessions "
            f"(the file's first: "
            f"{', '.join(s['instance_id'] for s in sessions)}), {calls} model calls in all: each session's calls "
            f"while its raw history held at most {result['cap']:,} tokens of `{result['cap_tokens_of']}`"
            f"{limit} "
            f"(calls per session kept / in the session: "
            f"{', '.join(str(s['calls']) + '/' + str(s['calls_in_session']) for s in sessions)}). "
            f"Every (model, policy, arm) on its own fresh server, sessions one after the other, one request of "
            f"`max_tokens=1` per call (its latency is the TTFT). *computed*: prompt tokens the engine computed; "
            f"*floor*: per call, the tokens of its history not present, in order, in the previous call's history "
            f"(length minus the longest common subsequence of the two token-id lists, `traces/floor.py`); for a "
            f"session's first call, its tokens beyond the common prefix with the previous session's last call "
            f"(the shared system prompt), in the model's own tokens. 1-minute load average during the runs: "
            f"{fmt(min(loads)) if loads else '–'} to "
            f"{fmt(max(loads)) if loads else '–'}.")


def plot(out: Path, result: dict, samples: dict) -> None:
    from ..common.plots import grouped_bars, lines

    if not samples:
        return
    model = next(iter(result["models"]))
    longest = max(result["sessions"], key=lambda s: s["calls"])["instance_id"]
    # One chart per policy: where a policy edits, and how much each arm pays there, differs per policy.
    for policy in dict.fromkeys(k.split("/")[1] for k in samples if k.startswith(f"{model}/")):
        series, xs = {}, []
        for key in (k for k in samples if k.startswith(f"{model}/{policy}/")):
            turns = [t for t in samples[key] if t["session"] == longest]
            xs = [t["turn"] + 1 for t in turns]
            series[key.split("/")[2]] = [t["computed"] for t in turns]
            series["floor"] = [t["floor"] for t in turns]
        lines(out / f"traces_per_turn_{policy}.png",
              f"{policy}, {model}\n{longest}: prompt tokens computed per call", xs, series, "model call",
              "tokens computed")
    rows = [s for s in result["summary"] if s["model"] == model]
    policies = list(dict.fromkeys(s["policy"] for s in rows))
    arms = list(dict.fromkeys(s["arm"] for s in rows))
    grouped_bars(out / "traces_over_floor.png", f"{model}: prompt tokens computed / floor", policies,
                 {a: [next((s["computed_over_floor"] for s in rows if s["policy"] == p and s["arm"] == a), None)
                      for p in policies] for a in arms}, "computed / floor")
    ttft = {a: [next((s["ttft_p50_s"] for s in rows if s["policy"] == p and s["arm"] == a), None) for p in policies]
            for a in arms}
    grouped_bars(out / "traces_ttft_p50.png", f"{model}: time to first token, p50", policies, ttft, "seconds")
