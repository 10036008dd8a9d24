"""examples/langgraph_quickstart.py against a real ``leyline-runtime serve`` (the default embedded
model, an API key given as LEYLINE_API_KEY): its edits go as directives, and run twice on one server
its second run says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from served_runtime import API_KEY, serving

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a server and two runs of the example (~17 s on 2 cores): make test-slow
def test_the_langgraph_quickstart_edits_through_directives_and_names_a_rerun(tmp_path):
    args = ["--max-cache-tokens", "8192", "--api-key", API_KEY, "--threads", "1", "--log-level", "warning"]
    with serving(args, tmp_path / "serve.log") as url:
        env = {**os.environ, "LEYLINE_BASE_URL": url, "LEYLINE_API_KEY": API_KEY}
        first, rerun = (subprocess.run([sys.executable, str(ROOT / "examples" / "langgraph_quickstart.py")],
                                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
                        for _ in range(2))
    for run in (first, rerun):
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.count("answer:") == 3
        assert "tool_output_edit" in run.stdout
    directives = re.search(r"^directives: (\d+)$", first.stdout, re.M)
    assert directives and int(directives.group(1)) > 0, first.stdout
    assert re.search(r"^call 1: 0 directives", first.stdout, re.M), first.stdout
    # The rerun adopts the session the first run left (same thread id) and starts the conversation over
    # in it: its first call drops the first run's turns, named as a rerun, not as a user correction.
    assert re.search(r"^call 1: 1 directives, .*\[rerun forget\]$", rerun.stdout, re.M), rerun.stdout
    assert "user_correction" not in rerun.stdout
