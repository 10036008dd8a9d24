"""leyline-bench agent: what an agent gains end to end from Leyline.

Held-out tasks run as real LangGraph agents (langchain.agents.create_agent) on a
runtime served over HTTP (uvicorn in a thread of this process; the agent reaches it
only through LeylineClient), in these arms on the same tasks and seeds:
append-only on a prefix cache; LangChain's edits (ClearToolUsesEdit + a ten-line
truncation rule) re-prefilled from the edit point (forget); the same edits through
Leyline amortize and auto. Per arm: solve rate with a 95% Wilson interval, prompt
tokens computed, model time, wall time with tool waits of none / a sampled
lognormal (added as simulated seconds, not slept), TTFT p50/p95, context
overflows, directives by applied mode. Differences inside the intervals are ties.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from leyline_runtime import RuntimeConfig

from .agent_run import ARMS, run_task
from .agent_tasks import FAMILIES, LATENCIES, LOG_LINES, make_tasks
from .inproc import serve_in_thread
from .machine import command_line, cpu_model
from .output import fmt, md_table, write_results
from .stats import percentile

NAME = "agent"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME)
    p.add_argument("--tasks", type=int, default=12, help="held-out tasks per family (the same seeds in each)")
    p.add_argument("--start", type=int, default=0, help="first task seed")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="which arms to run")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per model reply")
    p.add_argument("--max-calls", type=int, default=8, help="model calls per task before it counts as unsolved")
    p.set_defaults(run=run, quick_overrides={"tasks": 1, "start": 1, "arms": ["append", "edits-amortize"],
                                             "max_calls": 4})


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float | None, float | None]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return None, None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(records: list[dict]) -> dict:
    n, solved = len(records), sum(r["solved"] for r in records)
    low, high = wilson(solved, n)
    ttft = [t for r in records for t in r["ttft_s"]]
    modes: dict[str, int] = {}
    for r in records:
        for mode, count in r["modes"].items():
            modes[mode] = modes.get(mode, 0) + count
    model_s = sum(r["model_s"] for r in records)
    run_s = sum(r["run_s"] for r in records)
    return {
        "tasks": n, "solved": solved, "solve_rate": solved / n if n else None, "solve_rate_95": [low, high],
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "computed_tokens": sum(r["computed_tokens"] for r in records),
        "model_calls": sum(r["model_calls"] for r in records),
        "model_s": model_s,
        "wall_s": {name: run_s + (sum(sum(r["tool_waits_s"]) for r in records) if name != "none" else 0.0)
                   for name in LATENCIES},
        "ttft_s": {"p50": percentile(ttft, 50), "p95": percentile(ttft, 95)},
        "overflows": sum(r["overflow"] for r in records), "errors": sum(r["error"] is not None for r in records),
        "directives": sum(r["directives"] for r in records), "modes": modes,
    }


def compare(by_arm: dict[str, dict], a: str, b: str) -> str:
    """'a > b', 'a < b' or 'tie': a difference is one only outside both intervals."""
    if a not in by_arm or b not in by_arm:
        return "n/a"
    (la, ha), (lb, hb) = by_arm[a]["solve_rate_95"], by_arm[b]["solve_rate_95"]
    if la is None or lb is None:
        return "n/a"
    if la > hb:
        return f"{a} > {b}"
    if lb > ha:
        return f"{a} < {b}"
    return "tie"


def run(args, log=print) -> dict:
    tasks = make_tasks(args.tasks, args.start)
    records: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    with serve_in_thread(RuntimeConfig()) as url:
        for arm in args.arms:
            for task in tasks:
                # The simulated waits are drawn per task, so every arm sees the same sequence of tool latencies.
                result = run_task(url, ARMS[arm], task, LATENCIES["sampled"], args.max_tokens, args.max_calls)
                records[arm].append(dataclasses.asdict(result))
            log(f"{arm}: {sum(r['solved'] for r in records[arm])}/{len(tasks)} solved")
    summary = {family: {arm: summarize([r for r in recs if r["family"] == family]) for arm, recs in records.items()}
               for family in FAMILIES}
    summary["all"] = {arm: summarize(recs) for arm, recs in records.items()}
    result = {
        "benchmark": NAME, "cpu": cpu_model(),
        "settings": {"tasks_per_family": args.tasks, "start": args.start, "arms": args.arms,
                     "max_tokens": args.max_tokens, "max_calls": args.max_calls, "log_lines": LOG_LINES,
                     "latencies": {k: v.describe() for k, v in LATENCIES.items()}, "quick": args.quick},
        "arms": {arm: ARMS[arm].meaning for arm in args.arms},
        "summary": summary, "targets": targets(summary), "records": records,
    }
    plot(Path(args.out) / "agent.png", summary)
    return write_results(args.out, NAME, result, "Agent runs end to end", markdown(result))


def targets(summary: dict) -> dict:
    """The issue's targets, measured: token ratio to the forget arm at equal solve rate; long-family gain."""
    out: dict = {}
    everything = summary["all"]
    base = everything.get("edits-forget")
    for arm in ("edits-amortize", "edits-auto"):
        if base and arm in everything and everything[arm]["computed_tokens"]:
            out[f"{arm}_tokens_ratio_to_forget"] = base["computed_tokens"] / everything[arm]["computed_tokens"]
            out[f"{arm}_solve_vs_forget"] = compare(everything, arm, "edits-forget")
    long = summary["long"]
    for arm in ("edits-forget", "edits-amortize", "edits-auto"):
        if arm in long and "append" in long and long["append"]["tasks"]:
            out[f"long_{arm}_minus_append_points"] = 100 * (long[arm]["solve_rate"] - long["append"]["solve_rate"])
            out[f"long_{arm}_vs_append"] = compare(long, arm, "append")
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    lat = s["latencies"]["sampled"]
    lines = [f"Command: `{command_line()}`", "", f"CPU: {result['cpu']}", "",
             f"{s['tasks_per_family']} held-out tasks per family (seeds {s['start']}..), families: short (the tasks "
             f"as trained) and long (file, search and test outputs followed by a {s['log_lines']}-line log tail). "
             f"Tool latency 'sampled': lognormal, mu {lat['mu']:.3f}, sigma {lat['sigma']:.3f} (ln seconds; median "
             f"{lat['median_s']:.3f} s, mean {lat['mean_s']:.1f} s), fitted to 86% of gaps < 1 s and 95% < 10 s; "
             "the waits are added to the wall time, not slept. SummarizationMiddleware is not among the edits: "
             "its summary would be written by the 12.8M-parameter default model, which was not trained to "
             "summarize. Solve-rate differences inside the 95% intervals are ties.", ""]
    for arm, meaning in result["arms"].items():
        lines.append(f"- **{arm}**: {meaning}")
    for family, by_arm in result["summary"].items():
        lines += ["", f"## {family}", "", md_table(
            ["arm", "solved", "95% interval", "tokens computed", "prompt tokens", "model s", "wall s (no wait)",
             "wall s (sampled)", "TTFT p50", "TTFT p95", "overflows", "directives by mode"],
            [[arm, f"{a['solved']}/{a['tasks']}", "–" if a["solve_rate_95"][0] is None else
              f"{a['solve_rate_95'][0]:.2f}–{a['solve_rate_95'][1]:.2f}", a["computed_tokens"], a["prompt_tokens"],
              fmt(a["model_s"]), fmt(a["wall_s"]["none"]), fmt(a["wall_s"]["sampled"]), fmt(a["ttft_s"]["p50"]),
              fmt(a["ttft_s"]["p95"]), a["overflows"],
              ", ".join(f"{m} {c}" for m, c in sorted(a["modes"].items())) or "–"] for arm, a in by_arm.items()])]
    lines += ["", "## Targets", "", md_table(["measure", "value"],
                                              [[k, fmt(v) if isinstance(v, float) else v]
                                               for k, v in result["targets"].items()])]
    return "\n".join(lines)


def plot(path: Path, summary: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import _save

    fig, axes = plt.subplots(1, len(FAMILIES), figsize=(10, 4))
    for ax, family in zip(axes, FAMILIES):
        for arm, a in summary[family].items():
            if a["solve_rate"] is None:
                continue
            low, high = a["solve_rate_95"]
            ax.errorbar([a["computed_tokens"]], [a["solve_rate"]], fmt="o", capsize=4, label=arm,
                        yerr=[[a["solve_rate"] - low], [high - a["solve_rate"]]])
        ax.set(title=f"{family} family", xlabel="prompt tokens computed", ylabel="solve rate (95% interval)",
               ylim=(0, 1))
        ax.legend(fontsize=8)
    _save(fig, path)
