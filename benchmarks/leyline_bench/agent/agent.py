"""leyline-bench agent: what an agent gains end to end from Leyline.

Held-out tasks run as real LangGraph agents (langchain.agents.create_agent) on a
served engine (``--engine runtime``: the bundled runtime, uvicorn in a thread of this
process; ``--engine vllm``: ``vllm serve`` with Leyline's plugin and real weights, a
fresh server per arm; the agent reaches either only through LeylineClient over HTTP),
in these arms on the same tasks and seeds:
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
import time
from pathlib import Path

from leyline_sdk.errors import APIConnectionError

from .checkpoint import checkpoint_path, load_finished, save_finished
from .engines import DEFAULT_VLLM_MODEL, ENGINES, load_average, make_engine
from .prompts import SYSTEM_PROMPTS
from .report import markdown, plot
from .run import ARMS, run_task
from .tasks import FAMILIES, LATENCIES, LOG_LINES, TASK_KINDS, make_tasks
from ..common.arguments import comma_list
from leyline_testkit.cpu import cpu_model, has_amx
from ..common.output import write_results
from ..common.stats import percentile
from leyline_testkit.vllm_server import real_weights_dtype

NAME = "agent"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME)
    p.add_argument("--tasks", type=int, default=12, help="held-out tasks per family (the same seeds in each)")
    p.add_argument("--start", type=int, default=0, help="first task seed")
    p.add_argument("--kinds", type=comma_list(TASK_KINDS), default=[],
                   help=f"only tasks of these kinds (comma list of {', '.join(TASK_KINDS)}; default: all)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="which arms to run")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per model reply (default: 64 on the runtime, 128 on vLLM)")
    p.add_argument("--max-calls", type=int, default=8, help="model calls per task before it counts as unsolved")
    p.add_argument("--engine", choices=ENGINES, default="runtime",
                   help="runtime: the bundled runtime in this process; vllm: vllm serve + Leyline's plugin, "
                        "one server per arm (run with .venv-vllm's python)")
    p.add_argument("--model", default=DEFAULT_VLLM_MODEL,
                   help="--engine vllm: a leyline_bench.weights checkpoint name or a Hugging Face folder")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="--engine vllm: the served dtype (default: bfloat16, float32 on a CPU without "
                        "AVX512-BF16 or AMX)")
    p.add_argument("--block-size", type=int, default=32,
                   help="--engine vllm: KV block size (the CPU backends take multiples of 32)")
    p.add_argument("--system-prompt", choices=list(SYSTEM_PROMPTS), default=None,
                   help="the agent's system prompt (default: trained on the runtime, call-format on vLLM)")
    p.add_argument("--resume", action="store_true",
                   help="take the arms an earlier run with the same settings finished (<out>/agent.partial.*)")
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


def engine_defaults(args) -> None:
    """The settings each engine's model needs, where the command line left them open."""
    on_vllm = args.engine == "vllm"
    if args.max_tokens is None:
        args.max_tokens = 128 if on_vllm else 64  # a real model's answer quotes several values in prose
    if args.system_prompt is None:
        args.system_prompt = "call-format" if on_vllm else "trained"
    if on_vllm and args.dtype is None:
        args.dtype = real_weights_dtype()


def run_on(served, arm: str, task, args, tries: int = 3) -> dict:
    """One task's record. A task the server died under is run again, from its start, on a restarted
    server: the engine's death is not the agent's failure (the restart is reported with its reason)."""
    for _ in range(tries):
        try:
            # The simulated waits are drawn per task, so every arm sees the same sequence of tool latencies.
            result = run_task(served.url, ARMS[arm], task, LATENCIES["sampled"], args.max_tokens, args.max_calls,
                              SYSTEM_PROMPTS[args.system_prompt])
        except APIConnectionError as exc:  # the session's reset after the task found no server
            reason = str(exc)[:300]
        else:
            if served.alive():
                return dataclasses.asdict(result)
            reason = result.error or "the server died after the task"
        served.restart(f"{task.task_id}: {reason}")
    raise RuntimeError(f"{arm}: the server died under {task.task_id} {tries} times")


def run_arms(args, tasks, log) -> tuple[dict[str, list[dict]], dict[str, dict], dict]:
    """Every arm's records and its server's report; the engine's own description."""
    finished = load_finished(args)
    resumed = [arm for arm in args.arms if arm in finished]
    started, load_start = time.perf_counter(), load_average()
    with make_engine(args) as engine:
        for arm in args.arms:
            if arm in finished:
                log(f"{arm}: taken from {checkpoint_path(args.out)}")
                continue
            with engine.arm(arm) as served:
                records = [run_on(served, arm, task, args) for task in tasks]
            finished[arm] = {"records": records, "server": served.info}
            save_finished(args, finished)
            log(f"{arm}: {sum(r['solved'] for r in records)}/{len(tasks)} solved")
        described = {"name": engine.name, "description": engine.description}
    described.update(amx=has_amx(), load_start=load_start, load_end=load_average(),
                     elapsed_s=time.perf_counter() - started, resumed_arms=resumed)
    return ({arm: finished[arm]["records"] for arm in args.arms},
            {arm: finished[arm]["server"] for arm in args.arms}, described)


def run(args, log=print) -> dict:
    engine_defaults(args)
    tasks = make_tasks(args.tasks, args.start, args.kinds)
    records, servers, engine = run_arms(args, tasks, log)
    summary = {family: {arm: summarize([r for r in recs if r["family"] == family]) for arm, recs in records.items()}
               for family in FAMILIES}
    summary["all"] = {arm: summarize(recs) for arm, recs in records.items()}
    result = {
        "benchmark": NAME, "cpu": cpu_model(),
        "settings": {"tasks_per_family": args.tasks, "start": args.start, "kinds": args.kinds, "arms": args.arms,
                     "max_tokens": args.max_tokens, "max_calls": args.max_calls, "log_lines": LOG_LINES,
                     "system_prompt": args.system_prompt, "engine": args.engine,
                     "model": args.model if args.engine == "vllm" else "default",
                     "latencies": {k: v.describe() for k, v in LATENCIES.items()}, "quick": args.quick},
        "engine": engine, "servers": servers,
        "arms": {arm: ARMS[arm].meaning for arm in args.arms},
        "summary": summary, "targets": targets(summary),
    }
    plot(Path(args.out) / "agent.png", summary)
    return write_results(args.out, NAME, result, "Agent runs end to end", markdown(result),
                         samples={"records": records})


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
