"""``leyline-bench replay``: agent traces through four cache arms, turn by turn.

Arms (see ``replay_arms.py``) run interleaved on every turn, order rotated.
Per turn: prompt tokens, reused tokens, prefilled tokens, time to first
token. Totals per trace, per pattern and overall: cache-hit % = reused /
prompt tokens, TTFT median and sum.
"""

from __future__ import annotations

import json
from pathlib import Path

from leyline_sdk.errors import CapacityExceeded
from leyline_sdk.protocol import Message

from leyline_runtime.runtime import Runtime, RuntimeConfig
from ..common import plots
from ..common.machine import runtime_info
from ..common.output import md_table, write_results
from .replay_arms import ARMS, make_arm
from ..common.stats import median, ratio, rotated

DEFAULT_TRACES = Path(__file__).resolve().parents[3] / "benchmarks" / "traces.jsonl"


def add_parser(sub) -> None:
    p = sub.add_parser("replay")
    p.add_argument("--traces", default=str(DEFAULT_TRACES), help="JSONL, one trace per line")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="which arms to run")
    p.add_argument("--limit", type=int, default=None, help="first N traces only")
    p.add_argument("--max-turns", type=int, default=None, help="first N turns of each trace only")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype")
    p.set_defaults(run=run, quick_overrides={"limit": 1, "max_turns": 3})


def load_traces(path, limit=None, max_turns=None) -> list[dict]:
    with open(path) as f:
        traces = [json.loads(line) for line in f if line.strip()]
    traces = traces[:limit] if limit else traces
    for t in traces:
        t["turns"] = [[Message.model_validate(m) for m in turn] for turn in t["turns"]][:max_turns]
        t.setdefault("pattern", t.get("name", "trace"))
    return traces


def replay_trace(runtime: Runtime, trace: dict, arms: list[str]) -> dict:
    live = {name: make_arm(name, runtime) for name in arms}
    turns = {name: [] for name in arms}
    try:
        for k, history in enumerate(trace["turns"]):
            for name in rotated(arms, k):
                turns[name].append({"turn": k + 1, **live[name].turn(history).to_dict()})
    finally:
        for arm in live.values():
            arm.close()
    return {"name": trace["name"], "pattern": trace["pattern"], "turns": len(trace["turns"]),
            "per_turn": turns, "totals": {name: totals(rows) for name, rows in turns.items()}}


def totals(rows: list[dict]) -> dict:
    prompt = sum(r["prompt_tokens"] for r in rows)
    reused = sum(r["reused_tokens"] for r in rows)
    return {"prompt_tokens": prompt, "reused_tokens": reused,
            "prefilled_tokens": sum(r["prefilled_tokens"] for r in rows),
            "rotated_tokens": sum(r["rotated_tokens"] for r in rows),
            "cache_hit_pct": 100 * ratio(reused, prompt) if prompt else None,
            "cache_hit_pct_after_first": _hit([r for r in rows if r["turn"] > 1]),
            "ttft_median_s": median([r["ttft_s"] for r in rows]),
            "ttft_after_first_median_s": median([r["ttft_s"] for r in rows if r["turn"] > 1]),
            "ttft_sum_s": sum(r["ttft_s"] for r in rows)}


def _hit(rows: list[dict]) -> float | None:
    prompt = sum(r["prompt_tokens"] for r in rows)
    return 100 * sum(r["reused_tokens"] for r in rows) / prompt if prompt else None


def pooled(traces: list[dict], arms: list[str]) -> dict:
    return {name: totals([r for t in traces for r in t["per_turn"][name]]) for name in arms}


def run(args, log=print) -> dict:
    traces = load_traces(args.traces, args.limit, args.max_turns)
    runtime = Runtime(RuntimeConfig(model_path=args.model, dtype=args.dtype))
    results, skipped = [], []
    for t in traces:
        try:
            results.append(replay_trace(runtime, t, args.arms))
        except CapacityExceeded as e:  # a turn longer than the model's context
            skipped.append({"name": t["name"], "note": f"skipped: {e}"})
            log(f"replay {t['name']}: skipped: {e}")
            continue
        tot = results[-1]["totals"]
        log(f"replay {t['name']} ({len(t['turns'])} turns): " + ", ".join(
            f"{a} hit {tot[a]['cache_hit_pct']:.1f}% ttft {tot[a]['ttft_median_s'] * 1000:.0f} ms" for a in args.arms))
    patterns = sorted({r["pattern"] for r in results})
    summary = {"overall": pooled(results, args.arms),
               "patterns": {p: pooled([r for r in results if r["pattern"] == p], args.arms) for p in patterns}}
    result = {"benchmark": "replay", "traces_file": str(args.traces), "arms": args.arms,
              "settings": {"limit": args.limit, "max_turns": args.max_turns, "model": args.model or "embedded default",
                           "dtype": args.dtype},
              "runtime": runtime_info(runtime), "evictions": runtime.stats.evictions,
              "summary": summary, "traces": results, "skipped": skipped,
              "notes": ["cache-hit % = reused / prompt tokens summed over turns (turn 1 of a trace: cold prefill).",
                        "TTFT = cache sync + generate(max_tokens=1); the generated message is removed untimed.",
                        "Arms interleaved per turn, order rotated; one runtime, one session per arm."]}
    payload = write_results(args.out, "replay", result, "leyline-bench replay", _markdown(summary, args.arms))
    _plot(args.out, summary, args.arms)
    return payload


def _table(summary: dict, arms: list[str], key: str, scale: float = 1.0) -> str:
    rows = []
    for label, block in [("all", summary["overall"]), *summary["patterns"].items()]:
        rows.append([label, *[None if block[a][key] is None else block[a][key] * scale for a in arms]])
    return md_table(["traces", *arms], rows)


def _markdown(summary: dict, arms: list[str]) -> str:
    text = "## Cache hits: reused / prompt tokens, all turns (%)\n\n" + _table(summary, arms, "cache_hit_pct")
    text += "\n\n## Cache hits, turns 2+ (turn 1 is a cold prefill in every arm) (%)\n\n"
    text += _table(summary, arms, "cache_hit_pct_after_first")
    text += "\n\n## Time to first token, median over turns 2+ (ms)\n\n"
    text += _table(summary, arms, "ttft_after_first_median_s", 1000)
    o = summary["overall"]
    if "leyline_amortize" in o and "prefix_cache" in o:
        gap = (o["leyline_amortize"]["cache_hit_pct"] or 0) - (o["prefix_cache"]["cache_hit_pct"] or 0)
        text += f"\n\nleyline-amortize − prefix-cache: {gap:+.1f} percentage points of cache hits (all turns).\n"
    return text + "\n![replay cache hits](replay_hits.png)\n"


def _plot(out, summary, arms) -> None:
    labels = ["all", *summary["patterns"]]
    blocks = [summary["overall"], *summary["patterns"].values()]
    series = {a: [b[a]["cache_hit_pct"] for b in blocks] for a in arms}
    plots.grouped_bars(f"{out}/replay_hits.png", "cache hits per arm (reused / prompt tokens)", labels, series,
                       "cache hit %")
