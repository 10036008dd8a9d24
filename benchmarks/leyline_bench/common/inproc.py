"""A runtime server on loopback for a bench: in process (uvicorn in a background thread) or as a child process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from leyline_testkit.ports import free_port


@contextmanager
def serve_in_thread(config, startup_timeout: float = 120.0) -> Iterator[str]:
    """Start ``create_app(config)`` on 127.0.0.1:<free port>; yields the base URL."""
    import uvicorn

    from leyline_runtime.server import create_app

    app = create_app(config)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, name="leyline-bench-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass(frozen=True)
class ServedRuntime:
    url: str
    pid: int  # the server's own process (its memory is its own)
    command: list[str]


@contextmanager
def serve_in_subprocess(args: list[str], startup_timeout: float = 600.0,
                        log_level: str = "warning") -> Iterator[ServedRuntime]:
    """``leyline-runtime serve <args>`` on 127.0.0.1:<free port> in a child process, until it answers /healthz.

    The load generator then shares no interpreter (and no GIL) with the server, as real clients don't.
    """
    import os
    import subprocess
    import sys
    import tempfile

    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "leyline_runtime.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", log_level, *args]
    log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on a full pipe
    child = subprocess.Popen(cmd, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if child.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited: {log.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)
        yield ServedRuntime(url, child.pid, cmd)
    finally:
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
