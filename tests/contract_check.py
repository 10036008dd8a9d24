"""schemathesis' own runner against a served OpenAPI document: the contract check both engines' tests run
(``tests/server/test_server_contract.py`` on ``leyline-runtime serve``, ``tests/vllm/test_vllm_contract.py``
on ``vllm serve`` with the plugin). Pass condition: no finding at all.

Every phase (examples, coverage, fuzzing, stateful) and every check but the wall-clock one. Settings say
what the document cannot: a body over the server's request limits (bytes, messages, tokens, the model's
context) is refused 413 by design, documented on every body route, so 413 counts as an answer to valid
data and as a refusal of invalid data; a directive answered 422 for the session's current content is an
answer about state, as a 404 is; and the rules that compare fields, or need the served vocabulary, are
told to the generator (``server/schemathesis_hooks.py``). Derandomized, a bounded number of examples per
operation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
HOOKS_DIR = Path(__file__).parent / "server"


def run_contract_check(url: str, workdir: Path, headers: list[str] = (), paths: str | None = None
                       ) -> subprocess.CompletedProcess:
    """schemathesis run against ``url``/openapi.json, with ``headers`` (``Name: value``) on every request;
    ``paths``: a regex of the paths to test (default: every documented one)."""
    (workdir / "schemathesis.toml").write_text(CONFIG)
    args = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
            "--phases", "examples,coverage,fuzzing,stateful", "--checks", ",".join(CHECKS), "-n", str(EXAMPLES),
            "--generation-deterministic", "--request-timeout", "120", "--no-color"]
    for header in headers:
        args += ["-H", header]
    if paths is not None:
        args += ["--include-path-regex", paths]
    run = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                              "PYTHONPATH": os.pathsep.join([str(HOOKS_DIR), os.environ.get("PYTHONPATH", "")])})
    print(run.stdout[run.stdout.rfind("SUMMARY"):])
    return run


def findings(run: subprocess.CompletedProcess) -> str:
    """What a failed run says, for the assertion message."""
    return run.stdout[-20000:] + run.stderr[-3000:]
