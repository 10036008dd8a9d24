"""The agent benchmark's tasks, tools and tool latencies.

Tasks are the held-out split of the training tasks (leyline_training, split "test"),
each offered as LangChain tools that run the task's world for real. The "long"
family is the same tasks with verbose tool outputs: every read_file, search_files
and run_tests result is followed by a log tail of LOG_LINES lines (what files,
logs and search results look like in practice), so an append-only history fills
the 4096-token context within a few calls.

Tool latency is either none or drawn from a lognormal fitted to the figures in
issue 34 (86% of gaps under 1 s, 95% under 10 s); the waits are added to the wall
time as simulated seconds, never slept.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from langchain_core.tools import StructuredTool

from leyline_training.tools import execute
from leyline_training.task_kinds import KINDS
from leyline_training.transcripts import Task, make_task

FAMILIES = ("short", "long")
LONG_TOOLS = {"read_file", "search_files", "run_tests"}  # the ones whose output is a file, a log or a list
LOG_LINES = 60
TASK_KINDS = tuple(KINDS)  # what a held-out task asks for (kv, calc, tests, ...): --kinds picks some


def fit_lognormal(p_under_1s: float = 0.86, p_under_10s: float = 0.95) -> tuple[float, float]:
    """(mu, sigma) of ln(seconds) with P(X < 1 s) and P(X < 10 s) as given."""
    z1, z10 = NormalDist().inv_cdf(p_under_1s), NormalDist().inv_cdf(p_under_10s)
    sigma = math.log(10.0) / (z10 - z1)
    return -z1 * sigma, sigma


@dataclass(frozen=True)
class ToolLatency:
    """Seconds a tool call takes: 0, or lognormal(mu, sigma) drawn from a seeded stream."""

    name: str
    mu: float | None = None
    sigma: float | None = None

    def sampler(self, seed: str):
        rng = random.Random(f"latency:{self.name}:{seed}")
        if self.mu is None:
            return lambda: 0.0
        return lambda: rng.lognormvariate(self.mu, self.sigma)

    def describe(self) -> dict:
        if self.mu is None:
            return {"name": self.name, "distribution": "none"}
        return {"name": self.name, "distribution": "lognormal", "mu": self.mu, "sigma": self.sigma,
                "median_s": math.exp(self.mu), "mean_s": math.exp(self.mu + self.sigma ** 2 / 2),
                "fitted_to": "86% of gaps < 1 s, 95% < 10 s (issue 34)"}


LATENCIES = {"none": ToolLatency("none"), "sampled": ToolLatency("sampled", *fit_lognormal())}


def log_tail(seed: str, call: int) -> str:
    """A deterministic, plausible log tail; nothing in it answers a task."""
    rng = random.Random(f"log:{seed}:{call}")
    levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN"]
    lines = [f"2026-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
             f"{rng.randint(0, 59):02d} {rng.choice(levels)} worker-{rng.randint(1, 9)} "
             f"{rng.choice(['heartbeat ok', 'cache warm', 'flushed buffer', 'rotated log', 'gc pause'])} "
             f"seq={rng.randint(1000, 9999)}" for _ in range(LOG_LINES)]
    return "--- log ---\n" + "\n".join(lines)


@dataclass
class AgentTask:
    task: Task
    family: str

    @property
    def task_id(self) -> str:
        return f"{self.family}:{self.task.task_id}"

    @property
    def question(self) -> str:
        return self.task.messages[-1].content

    def tools(self, waits: list[float], latency) -> list[StructuredTool]:
        """The task's tools on its world; each call appends its (simulated) latency to ``waits``."""
        calls = [0]

        def make(spec: dict) -> StructuredTool:
            name = spec["function"]["name"]

            def run(**arguments) -> str:
                waits.append(latency())
                calls[0] += 1
                out = execute(self.task.world, name, arguments)
                if self.family == "long" and name in LONG_TOOLS:
                    out = out + "\n" + log_tail(self.task.task_id, calls[0])
                return out

            return StructuredTool(name=name, description=spec["function"].get("description", ""),
                                  args_schema=spec["function"].get("parameters", {"type": "object"}), func=run)

        return [make(spec) for spec in self.task.tools]


def make_tasks(n: int, start: int = 0, kinds: Sequence[str] = ()) -> list[AgentTask]:
    """``n`` held-out tasks per family, the same seeds in both families: the seeds from ``start`` on, or
    with ``kinds`` the first ``n`` of them whose task is of one of those kinds (a model's solvable ones)."""
    if kinds and (unknown := set(kinds) - set(TASK_KINDS)):
        raise ValueError(f"unknown task kinds {sorted(unknown)}; known: {', '.join(TASK_KINDS)}")
    tasks, seed = [], start
    while len(tasks) < n:
        task = make_task(seed, "test")
        if not kinds or task.kind in kinds:
            tasks.append(task)
        seed += 1
    return [AgentTask(t, family) for family in FAMILIES for t in tasks]
