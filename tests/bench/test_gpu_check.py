"""``make gpu-check``'s script (benchmarks/leyline_bench/gpu/check.py): its CPU dry run end to end,
the way a failing step shows, and how the CUDA tests are counted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leyline_bench.common import machine
from leyline_bench.gpu import check as gpu_check, runtime as gpu_runtime, wheels as gpu_wheels
from leyline_bench.gpu.bandwidth import SHAPES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(os.environ)
    env.pop("OUT", None)
    env["PY"] = sys.executable
    # through the script the device call runs (it installs nothing here: .venv imports the runtime's packages)
    proc = subprocess.run(["sh", "benchmarks/gpu_check.sh", "--dry-run", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc, out


@pytest.mark.slow  # the whole device script on the CPU (~35 s on 2 cores): make test-slow
def test_dry_run_passes_and_says_no_gpu_was_used(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-check: PASS on CPU dry run, no GPU used:"), last
    assert "no GPU used" in proc.stdout.splitlines()[0]
    assert not (out / "gpu-check.json").exists()  # a dry run never stands in for a GPU report


@pytest.mark.slow  # shares the dry run above
def test_dry_run_report_fields(dry_run):
    _, out = dry_run
    report = json.loads((out / "gpu-check-dry-run.json").read_text())
    assert report["dry_run"] is True and report["gpu"] is None and report["device"] == "cpu"
    assert report["no_gpu_reason"] and report["torch"] == torch.__version__ and report["triton"]
    assert report["status"] == "pass" and report["summary"].startswith("gpu-check: PASS")
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == list(gpu_check.STEPS)
    assert all(s["status"] == "pass" and s["seconds"] > 0 for s in steps.values())
    for name in ("kernels", "plugin"):
        assert steps[name]["triton_interpret"] == "1" and steps[name]["passed"] > 0 and steps[name]["failed"] == 0
    memory = steps["plugin"]["probe_memory"]
    assert memory and all(m["probe_pool_bytes"] >= 4 * 2**30 and 0 < m["probe_extra_bytes"] < 64 * 2**20
                          for m in memory.values())
    cells = steps["bandwidth"]["cells"]
    assert [c["shape"] for c in cells] == [s.name for s in SHAPES]
    assert {(c["shape"], c["row_width"], c["layers"]) for c in cells} >= {
        ("deepseek-v2-lite", 576, 27), ("deepseek-v3", 576, 61)}
    for c in cells:
        assert c["triton_bit_identical_to_torch"] is True
        assert set(c["gb_per_s"]) == {"copy", "triton", "triton_kernel", "torch"} and all(v > 0 for v in c["gb_per_s"].values())
        assert c["triton_vs_copy"] == pytest.approx(c["gb_per_s"]["triton"] / c["gb_per_s"]["copy"])
    runtime = steps["runtime"]
    assert runtime["applied_modes"] == ["amortize", "forget", "auto"] and runtime["kernel_backend"] == "torch"
    assert all(d == 0.0 for d in runtime["diff_vs_cpu"].values())  # CPU against CPU: the same sums
    assert all(d == 0.0 for d in runtime["bf16"]["diff_vs_cpu"].values())
    assert all(bar > 0 for bar in runtime["bf16"]["bar"].values())  # bf16 does round: the bar is not zero
    assert runtime["auto"]["cpu"]["choice"] == "repair" and runtime["auto"]["cpu"]["repaired_tokens"] > 0
    served = steps["served"]
    assert served["device"]["applied"] == served["cpu"]["applied"] == ["amortize", "forget", "amortize"]
    assert served["device"]["auto_choice"] == "repair" and served["device"]["tokens"]
    assert served["max_logprob_diff"] == 0.0
    assert runtime["forget_vs_fresh_prefill"] <= gpu_runtime.FRESH_PREFILL_TOLERANCE
    md = (out / "gpu-check-dry-run.md").read_text()
    assert report["summary"] in md and "deepseek-v3" in md and f"torch {torch.__version__}" in md


def test_a_failing_step_fails_the_check(tmp_path, monkeypatch, capsys):
    def broken(device):
        raise RuntimeError("rows went astray")

    monkeypatch.setattr(gpu_runtime, "check", broken)
    monkeypatch.setattr(machine, "_COMMAND", machine._COMMAND)  # main records its command line; undone after
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))  # main sets it; undone after
    skip = ["kernels", "plugin", "bandwidth", "served"]
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", *skip]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpu-check: FAIL") and "runtime fail (RuntimeError: rows went astray)" in last
    report = json.loads((tmp_path / "gpu-check-dry-run.json").read_text())
    assert report["status"] == "fail"
    assert [s["status"] for s in report["steps"]] == ["skip", "skip", "skip", "fail", "skip"]


def test_junit_counts_cuda_tests_apart(tmp_path):
    junit = tmp_path / "k.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t" name="test_a[torch-cpu]"/>'
        '<testcase classname="t" name="test_a[triton-cuda]"/>'
        '<testcase classname="t" name="test_b[cuda-float32]"><skipped message="needs CUDA"/></testcase>'
        '<testcase classname="t" name="test_c[torch-cuda]"><failure message="differ"/></testcase>'
        '<testcase classname="t" name="test_d[cuda]"><properties><property name="probe_extra_bytes" value="7"/>'
        '</properties></testcase>'
        '</testsuite></testsuites>')
    counts = gpu_check._parse_junit(junit)
    assert (counts["passed"], counts["skipped"], counts["failed"]) == (3, 1, 1)
    assert (counts["cuda_passed"], counts["cuda_skipped"]) == (2, 1)
    assert counts["properties"] == {"test_d[cuda]": {"probe_extra_bytes": "7"}}
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
        "from leyline_bench.gpu import check as gpu_check\n"
        f"sys.exit(gpu_check.main(['--dry-run', '--out', {str(tmp_path)!r}, '--skip', 'kernels', 'plugin', "
        "'bandwidth']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = {s["name"]: s for s in json.loads((tmp_path / "gpu-check-dry-run.json").read_text())["steps"]}
    assert steps["runtime"]["status"] == "skip" and "'llguidance'" in steps["runtime"]["reason"]
    assert steps["served"]["status"] == "skip" and "'llguidance'" in steps["served"]["reason"]
    assert "runtime skip (the runtime needs the module 'llguidance'" in proc.stdout.strip().splitlines()[-1]


def test_the_gpu_wheels_cover_what_the_runtime_imports():
    """Every requirement of the carried wheels (markers read for the GPU's Python 3.12) travels too or
    comes with the GPU image: none is left for an import there to miss."""
    assert gpu_wheels.uncovered_requirements() == []
    pins = gpu_wheels.pinned()
    assert {p.split("==")[0] for p in pins} == set(gpu_wheels.PACKAGES)
    cmd = gpu_wheels.download_command(pins, Path("/tmp/w"))
    assert "--no-deps" in cmd and cmd[cmd.index("--python-version") + 1] == "3.12" and pins[0] in cmd
