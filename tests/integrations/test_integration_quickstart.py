"""examples/langgraph_quickstart.py against a real ``leyline-runtime serve`` (the default embedded
model, an API key given as LEYLINE_API_KEY): its edits go as directives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from served_runtime import API_KEY, free_port, serve_command, wait_until_up

ROOT = Path(__file__).resolve().parents[2]


def test_the_langgraph_quickstart_edits_through_directives(tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(serve_command(port), stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until_up(server, port, log_path)
        env = {**os.environ, "LEYLINE_BASE_URL": f"http://127.0.0.1:{port}", "LEYLINE_API_KEY": API_KEY}
        run = subprocess.run([sys.executable, str(ROOT / "examples" / "langgraph_quickstart.py")], env=env,
                             capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("answer:") == 3
    directives = re.search(r"^directives: (\d+)$", run.stdout, re.M)
    assert directives and int(directives.group(1)) > 0, run.stdout
    assert "tool_output_edit" in run.stdout
