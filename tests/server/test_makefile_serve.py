"""``make serve`` stops cleanly on Ctrl-C / SIGTERM: the server shuts down and make reports no error.

The recipe runs the real ``leyline-runtime serve`` (embedded default model) from a throwaway venv folder
whose ``bin/leyline-runtime`` runs this checkout's CLI with the interpreter running the tests, so no
install happens. The signal goes to the whole process group, as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from leyline_testkit.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "leyline-runtime"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom leyline_runtime.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (tmp_path / "venv" / ".runtime-installed").touch()  # newer than pyproject.toml: make installs nothing
    return tmp_path / "venv"


def wait_healthy(port: int, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail("make serve did not come up")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_make_serve_exits_cleanly_on_a_signal(venv, signum):
    port = free_port()
    process = subprocess.Popen(["make", "--no-print-directory", "serve", f"VENV={venv}", f"PORT={port}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        wait_healthy(port, process)
        os.killpg(process.pid, signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "make: ***" not in err, err[-2000:]
    assert "Application shutdown complete" in err
    # make itself got the signal too and may re-raise it on itself (as any program may); it reports no error
    assert process.returncode in (0, -signum), (process.returncode, err[-2000:])
