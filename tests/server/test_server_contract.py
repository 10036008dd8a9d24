"""The OpenAPI contract of ``leyline-runtime serve``, checked by schemathesis' own runner: every phase
(examples, coverage, fuzzing, stateful) and every check but the wall-clock one, against a real server on the embedded default
model. Pass condition: no finding at all.

Settings say what the document cannot: a body over the server's request limits (bytes, messages,
tokens, the model's context) is refused 413 by design, documented on every body route, so 413 counts as
an answer to valid data and as a refusal of invalid data; a directive answered 422 for the session's
current content is an answer about state, as a 404 is; and the rules that compare fields, or need the
served vocabulary, are told to the generator (``schemathesis_hooks.py``). Derandomized, a bounded number
of examples per operation.
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

# a directive's span is checked against the session's current content: 422 there is about state
[[operations]]
include-path = "/directives"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "413", "422", "429"]
"""
EXAMPLES = 10
# Every check schemathesis has but its wall-clock one (``--checks all`` adds a 10 s response-time limit:
# a benchmark's business, and 2 busy cores vary).
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
          "response_schema_conformance", "negative_data_rejection", "positive_data_acceptance",
          "missing_required_header", "unsupported_method", "allow_header_conformance", "use_after_free",
          "ensure_resource_availability", "ignored_auth", "object_level_authorization")


def test_schemathesis_finds_nothing_on_the_bundled_runtime(tmp_path):
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    args = ["--api-key", API_KEY, "--threads", "1", "--log-level", "warning", "--max-cache-tokens", "8192"]
    with serving(args, tmp_path / "serve.log") as url:
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {API_KEY}",
             "--phases", "examples,coverage,fuzzing,stateful", "--checks", ",".join(CHECKS), "-n", str(EXAMPLES),
             "--generation-deterministic", "--request-timeout", "120", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=1500,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                 "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])})
    summary = run.stdout[run.stdout.rfind("SUMMARY"):]
    print(summary)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
