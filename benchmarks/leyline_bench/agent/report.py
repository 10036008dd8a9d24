"""The agent benchmark's report: its markdown tables and its plot."""

from __future__ import annotations

from pathlib import Path

from .tasks import FAMILIES
from ..common.machine import command_line
from ..common.output import fmt, md_table

DEFAULT_MODEL_NOTE = ("SummarizationMiddleware is not among the edits: its summary would be written by the "
                      "12.8M-parameter default model, which was not trained to summarize.")
VLLM_MODEL_NOTE = ("SummarizationMiddleware is not among the edits (a summary is a model call of its own, "
                   "the same in every edit arm, and not an edit Leyline applies).")


def interval(a: dict) -> str:
    low, high = a["solve_rate_95"]
    return "–" if low is None else f"{low:.2f}–{high:.2f}"


def modes_text(modes: dict) -> str:
    return ", ".join(f"{m} {c}" for m, c in sorted(modes.items())) or "–"


def family_table(by_arm: dict) -> str:
    return md_table(
        ["arm", "solved", "95% interval", "tokens computed", "prompt tokens", "model s", "wall s (no wait)",
         "wall s (sampled)", "TTFT p50", "TTFT p95", "overflows", "directives by mode"],
        [[arm, f"{a['solved']}/{a['tasks']}", interval(a), a["computed_tokens"], a["prompt_tokens"],
          fmt(a["model_s"]), fmt(a["wall_s"]["none"]), fmt(a["wall_s"]["sampled"]), fmt(a["ttft_s"]["p50"]),
          fmt(a["ttft_s"]["p95"]), a["overflows"], modes_text(a["modes"])] for arm, a in by_arm.items()])


def servers_table(servers: dict) -> str:
    """Per arm: the server's start, the arm's time and the load around it, vLLM's prefix cache."""
    rows = []
    for arm, s in servers.items():
        m = s.get("metrics", {})
        hits = (f"{m['prefix_cache_hits']:.0f} / {m['prefix_cache_queries']:.0f}"
                if "prefix_cache_queries" in m else "–")
        connector = f"{m['connector_hits']:.0f}" if "connector_hits" in m else "–"
        restarts = "; ".join(r["reason"][:120] for r in s.get("restarts", [])) or "–"
        rows.append([arm, fmt(s.get("startup_s")), fmt(s.get("arm_s")), fmt(s.get("load_before")),
                     fmt(s.get("load_after")), fmt(s.get("prefix_caching")), hits, connector, restarts])
    return md_table(["arm", "server start s", "arm s", "load before (1 min)", "load after", "vLLM prefix cache",
                     "prefix-cache hit / queried tokens", "tokens loaded by Leyline's connector",
                     "server restarts (task rerun)"], rows)


def intro(result: dict) -> list[str]:
    s = result["settings"]
    lat = s["latencies"]["sampled"]
    engine = result["engine"]
    amx = "with AMX" if engine.get("amx") else "no AMX"
    resumed = engine.get("resumed_arms") or []
    where = (f"CPU: {result['cpu']} ({amx}); load average (1 min) {fmt(engine['load_start'])} at the start, "
             f"{fmt(engine['load_end'])} at the end; {fmt(engine['elapsed_s'])} s in all"
             + (f", besides the arms taken from an earlier run with the same settings (--resume): "
                f"{', '.join(resumed)}." if resumed else "."))
    how = (f"Engine: {engine['description']}. Agent system prompt: `{s['system_prompt']}` "
           f"(leyline_bench.agent.prompts); {s['max_tokens']} tokens per reply, {s['max_calls']} model calls "
           "per task.")
    which = (f"the first from seed {s['start']} of kinds {', '.join(s['kinds'])}" if s.get("kinds")
             else f"seeds {s['start']}..")
    tasks = (f"{s['tasks_per_family']} held-out tasks per family ({which}), families: short (the tasks "
             f"as trained) and long (file, search and test outputs followed by a {s['log_lines']}-line log tail). "
             f"Tool latency 'sampled': lognormal, mu {lat['mu']:.3f}, sigma {lat['sigma']:.3f} (ln seconds; "
             f"median {lat['median_s']:.3f} s, mean {lat['mean_s']:.1f} s), fitted to 86% of gaps < 1 s and 95% "
             "< 10 s; the waits are added to the wall time, not slept.")
    note = VLLM_MODEL_NOTE if engine["name"] == "vllm" else DEFAULT_MODEL_NOTE
    return [f"Command: `{command_line()}`", "", where, "", how, "",
            f"{tasks} {note} Solve-rate differences inside the 95% intervals are ties.", ""]


def markdown(result: dict) -> str:
    lines = intro(result)
    for arm, meaning in result["arms"].items():
        lines.append(f"- **{arm}**: {meaning}")
    for family, by_arm in result["summary"].items():
        lines += ["", f"## {family}", "", family_table(by_arm)]
    lines += ["", "## Servers", "", servers_table(result["servers"])]
    lines += ["", "## Targets", "", md_table(["measure", "value"],
                                              [[k, fmt(v) if isinstance(v, float) else v]
                                               for k, v in result["targets"].items()])]
    return "\n".join(lines)


def plot(path: Path, summary: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..common.plots import _save

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
