"""``make gpu-check``: one script for a GPU machine (written for an H200 whose image has torch,
Triton and transformers, reaches no registry and cannot install vLLM; ``make gpu-wheels`` fetches
the runtime's other packages here, and ``benchmarks/gpu_check.sh`` installs them there).

Five steps, then one summary line (``gpu-check: PASS ...`` or ``gpu-check: FAIL ...``):

1. ``kernels``: ``pytest tests/kernels`` with ``TRITON_INTERPRET=0``, so the Triton kernel is
   compiled for CUDA and its rows are compared bit for bit with the CPU torch reference;
2. ``plugin``: ``pytest tests/integrations/test_vllm_layout.py``: the vLLM plugin's layout probe and
   row moves on CUDA tensors laid out as vLLM 0.32 lays out its caches (one shared buffer, per-layer
   strided views, several KV heads; MLA rows), and the probe's extra GPU memory on a 4 GiB pool;
3. ``bandwidth``: the Triton kernel against a plain indexed copy (:mod:`.bandwidth`) at
   DeepSeek-V2-Lite / V3 rows and a GQA head row, 4k and 32k tokens;
4. ``runtime``: the bundled runtime's forward and every directive mode (amortize, forget, auto with
   its repair) on CUDA against the CPU, in fp32 and bf16 (:mod:`.runtime`);
5. ``served``: one session over HTTP, the runtime's app in this process, on CUDA against the CPU
   (:mod:`.served`).

A step whose modules the image lacks is skipped with the module named.

Without CUDA, or with ``--dry-run``, the same steps run on the CPU at tiny sizes (Triton through
``TRITON_INTERPRET=1``), say that no GPU was used, and write ``gpu-check-dry-run.{json,md}``
instead of ``gpu-check.{json,md}``, so a dry run never overwrites a GPU report. The report goes to
``--out``, else ``$OUT`` (the GPU machine's output folder), else ``docs/perf/gpu``.

Imports only torch (and triton, lazily), the repo's own packages and the standard library.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from ..common.machine import REPO_ROOT, set_command
from ..common.output import md_table, write_results

GPU_TOKENS = [4096, 32768]
DRY_RUN_TOKENS = [16]
GPU_REPS, DRY_RUN_REPS = 20, 2
KERNEL_TESTS = "tests/kernels"
# The dry run's share of them: the CPU suite runs them all; here only the Triton-vs-torch comparisons.
DRY_RUN_KERNEL_TESTS = "bit_identical"
PLUGIN_TESTS = "tests/integrations/test_vllm_layout.py"
PYTEST_TIMEOUT_S = 240
DEVICE_COPY_BYTES, DRY_RUN_COPY_BYTES = 4 * 2**30, 2**20  # the device's own copy, the bar for GB/s
STEPS = ("kernels", "plugin", "bandwidth", "runtime", "served")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m leyline_bench.gpu.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="run on the CPU at tiny sizes even where CUDA exists (automatic without CUDA)")
    p.add_argument("--out", default=None, help="report folder (default: $OUT when set, else docs/perf/gpu)")
    p.add_argument("--tokens", type=int, nargs="+", default=None,
                   help=f"tokens moved per bandwidth cell (default: {GPU_TOKENS} on a GPU, {DRY_RUN_TOKENS} dry)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"timed repetitions per arm (default: {GPU_REPS} on a GPU, {DRY_RUN_REPS} dry)")
    p.add_argument("--skip", nargs="+", default=[], choices=list(STEPS),
                   help="steps to leave out (reported as skipped)")
    return p


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None


def _parse_junit(path: Path) -> dict:
    """Outcome counts of a junit XML report, all tests and those run on CUDA (ids name ``cuda``), and
    the properties tests recorded (``record_property``), by test."""
    counts = {key: 0 for key in ("passed", "failed", "skipped", "cuda_passed", "cuda_skipped")}
    failed, properties = [], {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        counts[outcome] += 1
        if "cuda" in case.get("name", "") and outcome != "failed":
            counts[f"cuda_{outcome}"] += 1
        if outcome == "failed":
            failed.append(f"{case.get('classname')}::{case.get('name')}")
        recorded = {p.get("name"): p.get("value") for p in case.iter("property")}
        if recorded:
            properties[case.get("name")] = recorded
    return {**counts, "failed_tests": failed[:20], "properties": properties}


def pytest_step(paths: list[str], on_gpu: bool, dry_run_select: str | None) -> dict:
    """``pytest paths`` in a child process: all of it with Triton compiled on CUDA (every CUDA case
    must run and pass); on the CPU, interpreted, only the tests ``dry_run_select`` picks (all if None)."""
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skip", "reason": "pytest is not installed"}
    env = dict(os.environ, TRITON_INTERPRET="0" if on_gpu else "1")
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "tests.xml"
        select = ["-k", dry_run_select] if not on_gpu and dry_run_select else []
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select, f"--junitxml={junit}", *paths]
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=PYTEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"status": "fail", "reason": f"pytest ran past {PYTEST_TIMEOUT_S} s"}
        if not junit.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            return {"status": "fail", "reason": f"pytest exited {proc.returncode}: {' | '.join(tail)}"}
        counts = _parse_junit(junit)
    shown = ["python", *(a for a in cmd[1:] if not a.startswith("--junitxml"))]
    result = {"command": " ".join(shown), "triton_interpret": env["TRITON_INTERPRET"], **counts}
    if proc.returncode != 0 or counts["failed"]:
        return {**result, "status": "fail", "reason": f"{counts['failed']} tests failed (exit {proc.returncode})"}
    if on_gpu and (counts["cuda_passed"] == 0 or counts["cuda_skipped"]):
        return {**result, "status": "fail",
                "reason": f"CUDA tests: {counts['cuda_passed']} passed, {counts['cuda_skipped']} skipped"}
    return {**result, "status": "pass", "reason": None}


def plugin_tests(on_gpu: bool) -> dict:
    """The vLLM plugin's layout probe and row moves on vLLM 0.32's emulated cache layouts, with the
    probe's extra memory on a 4 GiB pool (the test records it)."""
    result = pytest_step([PLUGIN_TESTS], on_gpu, None)
    recorded = result.get("properties", {})
    memory = {name: {k: int(v) for k, v in props.items()} for name, props in recorded.items()
              if "probe_extra_bytes" in props}
    return {**result, "probe_memory": memory}


def bandwidth(device: str, tokens: list[int], reps: int) -> dict:
    from .bandwidth import device_copy_gb_per_s, measure_all

    if importlib.util.find_spec("triton") is None:
        return {"status": "skip", "reason": "triton is not installed"}
    cells = measure_all(tokens, torch.bfloat16, device, reps)
    broken = [f"{c['shape']} {c['tokens']}" for c in cells if not c["triton_bit_identical_to_torch"]]
    copy_bytes = DEVICE_COPY_BYTES if device.startswith("cuda") else DRY_RUN_COPY_BYTES
    return {"status": "fail" if broken else "pass",
            "reason": f"Triton rows differ from torch's at {', '.join(broken)}" if broken else None,
            "dtype": "bfloat16", "reps": reps, "cells": cells,
            "device_copy_bytes": copy_bytes, "device_copy_gb_per_s": device_copy_gb_per_s(device, copy_bytes, reps)}


def _run_step(name: str, fn, skip: list[str]) -> dict:
    if name in skip:
        return {"name": name, "status": "skip", "reason": "--skip", "seconds": 0.0}
    print(f"gpu-check: {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # a broken step is a FAIL with its error, and the others still run
        result = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}"}
    result = {"name": name, **result, "seconds": time.perf_counter() - t0}
    print(f"gpu-check: {name} {result['status']}" + (f" ({result['reason']})" if result.get("reason") else ""),
          flush=True)
    return result


def summary_line(report: dict) -> str:
    steps = report["steps"]
    where = report["gpu"] or "CPU dry run, no GPU used"
    parts = [f"{s['name']} {s['status']}" + (f" ({s['reason']})" if s["status"] != "pass" and s.get("reason")
                                            else "") for s in steps]
    cells = next((s.get("cells") for s in steps if s["name"] == "bandwidth" and s.get("cells")), None)
    if cells and not report["dry_run"]:  # interpreted Triton's GB/s say nothing
        ratios = [c["triton_vs_copy"] for c in cells]
        alone = [c["triton_kernel_vs_copy"] for c in cells]
        parts.append(f"triton/copy {min(ratios):.2f}-{max(ratios):.2f} (kernel alone {min(alone):.2f}-{max(alone):.2f})")
    return f"gpu-check: {report['status'].upper()} on {where}: " + "; ".join(parts)


def _markdown(report: dict) -> str:
    lines = [f"**{report['summary']}**", "",
             f"GPU: {report['gpu'] or 'none (' + report['no_gpu_reason'] + ')'}; torch {report['torch']}, "
             f"triton {report['triton'] or 'not installed'}, CUDA {report['cuda_version'] or '–'}.", "",
             md_table(["step", "status", "seconds", "note"],
                      [[s["name"], s["status"], s["seconds"], s.get("reason")] for s in report["steps"]])]
    for step in report["steps"]:
        if step["name"] == "bandwidth" and step.get("cells"):
            lines += ["", "Bandwidth, bf16; GB/s = 2 x rows x width x 2 B / median time (rows read and written "
                          "once; copy = index_select + index_copy_; triton = the call the runtime makes, its argument checks "
                          "included; kernel alone = without them); rows = tokens x layers (x KV heads for GQA)"
                      + ("; dry run: Triton interpreted on the CPU, its GB/s mean nothing" if report["dry_run"]
                         else "") + ":", "",
                      md_table(["rows of", "tokens", "layers", "rows", "width", "copy GB/s", "triton GB/s",
                                "kernel alone GB/s", "torch GB/s", "triton/copy", "kernel alone/copy",
                                "bit-identical"],
                               [[c["shape"], c["tokens"], c["layers"], c["rows"], c["row_width"],
                                 c["gb_per_s"]["copy"], c["gb_per_s"]["triton"], c["gb_per_s"]["triton_kernel"],
                                 c["gb_per_s"]["torch"], c["triton_vs_copy"], c["triton_kernel_vs_copy"],
                                 c["triton_bit_identical_to_torch"]]
                                for c in step["cells"]]),
                      "", f"The device's own copy (`copy_` of {step['device_copy_bytes'] / 2**30:.3g} GiB, bytes read and "
                          f"written): {step['device_copy_gb_per_s']:.0f} GB/s."]
        if step["name"] in ("kernels", "plugin") and "passed" in step:
            lines += ["", f"{step['name'].capitalize()} tests (`{step['command']}`, TRITON_INTERPRET="
                          f"{step['triton_interpret']}): {step['passed']} passed ({step['cuda_passed']} on CUDA), "
                          f"{step['skipped']} skipped, {step['failed']} failed."]
        for test, memory in step.get("probe_memory", {}).items():
            lines += [f"Layout probe ({test}): {memory['probe_extra_bytes'] / 2**20:.1f} MiB extra on a "
                      f"{memory['probe_pool_bytes'] / 2**30:.1f} GiB pool."]
        if step["name"] == "runtime" and "diff_vs_cpu" in step:
            fp32 = ", ".join(f"{k} {v:.2g}" for k, v in step["diff_vs_cpu"].items())
            bf16 = ", ".join(f"{k} {v:.2g} (bar {step['bf16']['bar'][k]:.2g})"
                             for k, v in step["bf16"]["diff_vs_cpu"].items())
            auto = step["auto"]
            lines += ["", f"Runtime on {step['device']} (kernel {step['kernel_backend']}) vs CPU, max |diff| / "
                          f"largest value: fp32 {fp32}; forget vs fresh prefill {step['forget_vs_fresh_prefill']:.2g}. "
                          f"bf16 {bf16}. auto chose {auto['device']['choice']} (CPU {auto['cpu']['choice']}; layer-1 "
                          f"change {auto['device']['layer1_change']:.4g} vs {auto['cpu']['layer1_change']:.4g}). "
                          f"Greedy tokens equal: fp32 {step['greedy_tokens_equal_cpu']}, bf16 "
                          f"{step['greedy_tokens_equal_cpu_bf16']}."]
        if step["name"] == "served" and "device" in step:
            dev, cpu = step["device"], step["cpu"]
            lines += ["", f"Served over HTTP: applied {dev['applied']} (auto {dev['auto_choice']}; CPU {cpu['applied']}, "
                          f"auto {cpu['auto_choice']}); generated {dev['text']!r} (CPU {cpu['text']!r}); largest "
                          f"logprob difference {step['max_logprob_diff']:.2g} nats."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    set_command(["python", "-m", "leyline_bench.gpu.check", *(sys.argv[1:] if argv is None else argv)])
    on_gpu = torch.cuda.is_available() and not args.dry_run
    # Before triton is first imported (leyline_kernels imports it at the first launch).
    os.environ["TRITON_INTERPRET"] = "0" if on_gpu else "1"
    device = "cuda" if on_gpu else "cpu"
    no_gpu_reason = None if on_gpu else ("--dry-run" if torch.cuda.is_available()
                                         else "no CUDA device: torch.cuda.is_available() is False")
    if not on_gpu:
        print(f"gpu-check: no GPU used ({no_gpu_reason}); CPU dry run at tiny sizes", flush=True)
    tokens = args.tokens or (GPU_TOKENS if on_gpu else DRY_RUN_TOKENS)
    reps = args.reps or (GPU_REPS if on_gpu else DRY_RUN_REPS)
    from . import runtime as gpu_runtime, served as gpu_served

    plan = {"kernels": lambda: pytest_step([KERNEL_TESTS], on_gpu, DRY_RUN_KERNEL_TESTS),
            "plugin": lambda: plugin_tests(on_gpu),
            "bandwidth": lambda: bandwidth(device, tokens, reps),
            "runtime": lambda: gpu_runtime.check(device),
            "served": lambda: gpu_served.check(device)}
    report = {"benchmark": "gpu-check", "dry_run": not on_gpu, "device": device,
              "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "no_gpu_reason": no_gpu_reason,
              "torch": torch.__version__, "triton": _version("triton"), "cuda_version": torch.version.cuda,
              "steps": []}
    out = args.out or os.environ.get("OUT") or str(REPO_ROOT / "docs" / "perf" / "gpu")
    name = "gpu-check" if on_gpu else "gpu-check-dry-run"
    for step, run in plan.items():
        report["steps"].append(_run_step(step, run, args.skip))
        # written after every step: a run stopped at its time limit still leaves what it measured
        done = len(report["steps"]) == len(plan)
        failed = any(s["status"] == "fail" for s in report["steps"])
        report["status"] = "fail" if failed else "pass" if done else "incomplete"
        report["summary"] = summary_line(report)
        write_results(out, name, report, "make gpu-check", _markdown(report))
    print(f"gpu-check: report in {Path(out) / name}.json and .md", flush=True)
    print(report["summary"], flush=True)
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
