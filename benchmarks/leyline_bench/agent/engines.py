"""Where the agent bench's arms are served: the bundled runtime, or ``vllm serve`` with Leyline's plugin.

``runtime``: every arm on one runtime served in a thread of this process (as the bench has always
run; each task's session is its own). ``vllm``: each arm on its own ``vllm serve`` of the same
weights, started for that arm and stopped after it, so no arm finds another's prompts in vLLM's
prefix cache; the tasks of one arm share it (the system prompt and tools, as a fleet's sessions
would). Per arm the engine reports what it saw: startup time, the load average around the arm, and
for vLLM whether its prefix cache was on and what it hit (``/metrics``).

A server that dies under an arm (on a shared machine the kernel's OOM killer once took vLLM's worker
mid-arm) is restarted and the task it died under is run again from its start: an engine's death is
not the agent's failure. Each restart is reported with its reason; vLLM's counters then cover the
last server's life only.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import httpx

ENGINES = ("runtime", "vllm")
DEFAULT_VLLM_MODEL = "qwen2.5-coder-1.5b-instruct"
PREFIX_METRICS = {  # vLLM's counters, over every request of the arm's server
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "connector_queries": "vllm:external_prefix_cache_queries_total",  # what was asked of Leyline's connector
    "connector_hits": "vllm:external_prefix_cache_hits_total",
}


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def model_folder(model: str) -> Path:
    """A Hugging Face folder: ``model`` itself where it is one, else a checkpoint name of
    ``leyline_bench.weights`` (fetched and converted once, then cached)."""
    if Path(model).is_dir():
        return Path(model)
    from .. import weights

    return weights.hf_folder(model)


def metric_totals(text: str) -> dict[str, float]:
    """The counters of :data:`PREFIX_METRICS` from a ``/metrics`` page (summed over label sets)."""
    out: dict[str, float] = {}
    for key, name in PREFIX_METRICS.items():
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.MULTILINE)
        if values:
            out[key] = sum(float(v) for v in values)
    return out


def prefix_caching_on(log_text: str) -> bool | None:
    """What vLLM's engine config line says (vLLM switches it off for MLA on CPUs without AMX)."""
    found = re.search(r"enable_prefix_caching=(True|False)", log_text)
    return None if found is None else found.group(1) == "True"


class RuntimeArm:
    """An arm on the in-process runtime: it lives as long as this process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.info: dict = {"load_before": load_average(), "restarts": []}

    def alive(self) -> bool:
        return True

    def restart(self, reason: str) -> None:
        raise RuntimeError(f"the in-process runtime cannot be restarted ({reason})")


class RuntimeEngine:
    """The bundled runtime in a thread of this process, one server for every arm."""

    name = "runtime"

    def __init__(self, args) -> None:
        self.args = args
        self.description = "bundled runtime, default model"
        self._serving = None
        self.url: str | None = None

    def __enter__(self) -> Self:
        from leyline_runtime import RuntimeConfig

        from ..common.inproc import serve_in_thread

        self._serving = serve_in_thread(RuntimeConfig())
        self.url = self._serving.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._serving.__exit__(*exc)

    @contextmanager
    def arm(self, arm: str) -> Iterator[RuntimeArm]:
        served = RuntimeArm(self.url)
        yield served
        served.info["load_after"] = load_average()


class VllmArm:
    """An arm's own ``vllm serve``; :meth:`restart` replaces a server that died."""

    def __init__(self, folder: Path, workdir: Path, args) -> None:
        self.folder, self.workdir, self.args = folder, workdir, args
        self.server = None
        self.info: dict = {"restarts": []}

    @property
    def url(self) -> str:
        return self.server.base_url

    def start(self) -> None:
        from leyline_testkit.vllm_server import VllmServer

        self.server = VllmServer(self.folder, self.workdir / f"server-{len(self.info['restarts'])}",
                                 dtype=self.args.dtype, block_size=self.args.block_size)
        self.server.start()
        health = httpx.get(self.url + "/healthz", timeout=30).json()
        self.info.setdefault("startup_s", self.server.startup_s)
        self.info.update(prefix_caching=prefix_caching_on(self.server.log_text()), splice=health.get("splice"))

    def alive(self) -> bool:
        if self.server.proc is None or self.server.proc.poll() is not None:
            return False
        try:
            return httpx.get(self.url + "/health", timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def restart(self, reason: str) -> None:
        died = self.server.log_tail(600)
        self.server.stop()
        self.info["restarts"].append({"reason": reason, "log_tail": died})
        self.start()
        self.info["restarts"][-1]["startup_s"] = self.server.startup_s

    def finish(self) -> None:
        self.info["load_after"] = load_average()
        self.info["metrics"] = metric_totals(httpx.get(self.url + "/metrics", timeout=30).text)


class VllmEngine:
    """``vllm serve`` with Leyline's plugin, a fresh server per arm (``leyline_testkit.vllm_server``)."""

    name = "vllm"

    def __init__(self, args) -> None:
        self.args = args
        self.folder = model_folder(args.model)
        self.description = f"vllm serve + Leyline plugin, {args.model} ({args.dtype}, block {args.block_size})"
        self._tmp = None

    def __enter__(self) -> Self:
        self._tmp = tempfile.TemporaryDirectory(prefix="leyline-agent-vllm-")
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    @contextmanager
    def arm(self, arm: str) -> Iterator[VllmArm]:
        served = VllmArm(self.folder, Path(self._tmp.name) / arm, self.args)
        served.start()
        try:
            served.info["load_before"] = load_average()
            started = time.perf_counter()
            yield served
            served.info["arm_s"] = time.perf_counter() - started
            served.finish()
        finally:
            served.server.stop()


def make_engine(args):
    return VllmEngine(args) if args.engine == "vllm" else RuntimeEngine(args)
