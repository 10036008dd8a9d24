"""The OpenAPI contract of ``leyline-runtime serve``: schemathesis' own runner (``contract_check``) against a
real server on the embedded default model, every documented route. Pass condition: no finding at all."""

from __future__ import annotations

import pytest

from contract_check import findings, run_contract_check
from served_runtime import API_KEY, serving

pytestmark = pytest.mark.slow


def test_schemathesis_finds_nothing_on_the_bundled_runtime(tmp_path):
    args = ["--api-key", API_KEY, "--threads", "1", "--log-level", "warning", "--max-cache-tokens", "8192"]
    with serving(args, tmp_path / "serve.log") as url:
        run = run_contract_check(url, tmp_path, headers=[f"Authorization: Bearer {API_KEY}"])
    assert run.returncode == 0, findings(run)
