"""A real `leyline-runtime serve` subprocess for the tests that need one (a module-scoped fixture and its helpers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from leyline_testkit.ports import free_port


API_KEY = "cli-test-key"
ADMIN_KEY = "cli-admin-key"  # sees the whole service's metrics; API_KEY sees its tenant's
STARTUP_TIMEOUT_S = 120


def serve_command(port: int, args: list[str]) -> list[str]:
    """``leyline-runtime serve`` on 127.0.0.1:``port`` with ``args``, from this interpreter's environment."""
    script = shutil.which("leyline-runtime", path=str(Path(sys.executable).parent))
    base = [script] if script else [sys.executable, "-m", "leyline_runtime.cli"]
    return [*base, "serve", "--host", "127.0.0.1", "--port", str(port), *args]


@contextmanager
def serving(args: list[str], log_path: Path) -> Iterator[str]:
    """A ``leyline-runtime serve`` subprocess with ``args`` on a free port until the block ends; yields its URL."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(port, args), stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until_up(proc, port, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    args = ["--max-cache-tokens", "8192", "--api-key", API_KEY, "--admin-key", ADMIN_KEY, "--threads", "1",
            "--log-level", "warning"]
    with serving(args, log_path) as url:
        yield url, log_path


def wait_until_up(proc: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"server did not come up in {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()}")


def scrape(base_url: str) -> str:
    r = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    return r.text
