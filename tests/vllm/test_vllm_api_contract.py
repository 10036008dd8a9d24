"""The REST contract (tests/session_api_contract.py: the session routes and the session-bound chat, also
run against the bundled runtime by tests/server/test_server_api.py) against ``vllm serve`` with Leyline's
endpoint plugin."""

from __future__ import annotations

import httpx
import pytest
from session_api_contract import contract_cases  # tests/ (its conftest puts it on sys.path)


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=600) as c:
        yield c


@pytest.mark.parametrize("check", **contract_cases())
def test_rest_contract(http, check):
    check(http)
