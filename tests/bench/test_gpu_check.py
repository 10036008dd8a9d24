"""``make gpu-check``'s script (benchmarks/leyline_bench/gpu_check.py): its CPU dry run end to end,
the way a failing step shows, and how the CUDA tests are counted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leyline_bench import gpu_check, gpu_runtime, machine
from leyline_bench.gpu_bandwidth import SHAPES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(os.environ)
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, "-m", "leyline_bench.gpu_check", "--dry-run", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def test_dry_run_passes_and_says_no_gpu_was_used(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-check: PASS on CPU dry run, no GPU used:"), last
    assert "no GPU used" in proc.stdout.splitlines()[0]
    assert not (out / "gpu-check.json").exists()  # a dry run never stands in for a GPU report


def test_dry_run_report_fields(dry_run):
    _, out = dry_run
    report = json.loads((out / "gpu-check-dry-run.json").read_text())
    assert report["dry_run"] is True and report["gpu"] is None and report["device"] == "cpu"
    assert report["no_gpu_reason"] and report["torch"] == torch.__version__ and report["triton"]
    assert report["status"] == "pass" and report["summary"].startswith("gpu-check: PASS")
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ["kernels", "bandwidth", "runtime"]
    assert all(s["status"] == "pass" and s["seconds"] > 0 for s in steps.values())
    kernels = steps["kernels"]
    assert kernels["triton_interpret"] == "1" and kernels["passed"] > 0 and kernels["failed"] == 0
    cells = steps["bandwidth"]["cells"]
    assert [c["shape"] for c in cells] == [s.name for s in SHAPES]
    assert {(c["shape"], c["row_width"], c["layers"]) for c in cells} >= {
        ("deepseek-v2-lite", 576, 27), ("deepseek-v3", 576, 61)}
    for c in cells:
        assert c["triton_bit_identical_to_torch"] is True
        assert set(c["gb_per_s"]) == {"copy", "triton", "triton_kernel", "torch"} and all(v > 0 for v in c["gb_per_s"].values())
        assert c["triton_vs_copy"] == pytest.approx(c["gb_per_s"]["triton"] / c["gb_per_s"]["copy"])
    runtime = steps["runtime"]
    assert runtime["applied_modes"] == ["amortize", "forget"] and runtime["kernel_backend"] == "torch"
    assert all(d == 0.0 for d in runtime["diff_vs_cpu"].values())  # CPU against CPU: the same sums
    assert runtime["forget_vs_fresh_prefill"] <= gpu_runtime.FRESH_PREFILL_TOLERANCE
    md = (out / "gpu-check-dry-run.md").read_text()
    assert report["summary"] in md and "deepseek-v3" in md and f"torch {torch.__version__}" in md


def test_a_failing_step_fails_the_check(tmp_path, monkeypatch, capsys):
    def broken(device):
        raise RuntimeError("rows went astray")

    monkeypatch.setattr(gpu_runtime, "check", broken)
    monkeypatch.setattr(machine, "_COMMAND", machine._COMMAND)  # main records its command line; undone after
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))  # main sets it; undone after
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", "kernels", "bandwidth"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpu-check: FAIL") and "runtime fail (RuntimeError: rows went astray)" in last
    report = json.loads((tmp_path / "gpu-check-dry-run.json").read_text())
    assert report["status"] == "fail"
    assert [s["status"] for s in report["steps"]] == ["skip", "skip", "fail"]


def test_junit_counts_cuda_tests_apart(tmp_path):
    junit = tmp_path / "k.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t" name="test_a[torch-cpu]"/>'
        '<testcase classname="t" name="test_a[triton-cuda]"/>'
        '<testcase classname="t" name="test_b[cuda-float32]"><skipped message="needs CUDA"/></testcase>'
        '<testcase classname="t" name="test_c[torch-cuda]"><failure message="differ"/></testcase>'
        '</testsuite></testsuites>')
    counts = gpu_check._parse_junit(junit)
    assert (counts["passed"], counts["skipped"], counts["failed"]) == (2, 1, 1)
    assert (counts["cuda_passed"], counts["cuda_skipped"]) == (1, 1)
    assert counts["failed_tests"] == ["t::test_c[torch-cuda]"]


def test_runtime_step_skipped_with_the_missing_module_named(tmp_path):
    """A GPU image without one of the runtime's dependencies: the step is skipped and says which."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'llguidance' or name.startswith('llguidance.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from leyline_bench import gpu_check\n"
        f"sys.exit(gpu_check.main(['--dry-run', '--out', {str(tmp_path)!r}, '--skip', 'kernels', 'bandwidth']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runtime = json.loads((tmp_path / "gpu-check-dry-run.json").read_text())["steps"][2]
    assert runtime["status"] == "skip" and "'llguidance'" in runtime["reason"]
    assert "runtime skip (the runtime needs the module 'llguidance'" in proc.stdout.strip().splitlines()[-1]
