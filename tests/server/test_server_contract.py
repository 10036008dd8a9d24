"""The OpenAPI contract of ``leyline-runtime serve``, checked by schemathesis' own runner: every phase
(examples, coverage, fuzzing, stateful) and every check, against a real server on the embedded default
model. Pass condition: no finding at all.

Two settings say what the document cannot: a body over the server's request limits (bytes, messages,
tokens, the model's context) is refused 413 by design, documented on every body route, so 413 counts as
an answer to valid data and as a refusal of invalid data; and two rules that compare fields are told to
the generator (``schemathesis_hooks.py``). Derandomized, a bounded number of examples per operation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from served_runtime import API_KEY, serving

pytestmark = pytest.mark.slow

CONFIG = """\
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "413", "429"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
"""
EXAMPLES = 10


def test_schemathesis_finds_nothing_on_the_bundled_runtime(tmp_path):
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    args = ["--api-key", API_KEY, "--threads", "1", "--log-level", "warning", "--max-cache-tokens", "8192"]
    with serving(args, tmp_path / "serve.log") as url:
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {API_KEY}",
             "--phases", "examples,coverage,fuzzing,stateful", "--checks", "all", "-n", str(EXAMPLES),
             "--generation-deterministic", "--request-timeout", "120", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=1500,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                 "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])})
    summary = run.stdout[run.stdout.rfind("SUMMARY"):]
    print(summary)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
