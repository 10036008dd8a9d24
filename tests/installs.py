"""Throwaway installs for the packaging tests: commands run without our PYTHONPATH, fresh venvs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{' '.join(result.args)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def venv(path: Path) -> Path:
    ok(run([sys.executable, "-m", "venv", str(path)], cwd=path.parent))
    return path / "bin" / "python"


def python(interpreter: Path, code: str) -> str:
    return ok(run([str(interpreter), "-c", textwrap.dedent(code)], cwd=interpreter.parents[2]))
