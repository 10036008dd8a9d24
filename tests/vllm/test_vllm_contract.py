"""The plugin's routes on ``vllm serve``, as a client reads their contract: the OpenAPI document vLLM
serves, checked by schemathesis (``contract_check``, as the bundled runtime's is), and the API key.

Its own server, started as a user starts one with a key (``--api-key``): vLLM's key check guards only
its own path prefixes, so the plugin checks the key on its session routes itself (``api_server/auth``).
The paths tested are Leyline's documented ones: ``/sessions``, ``/directives``, ``/healthz``. The bound
``/v1/chat/completions`` shares its path with vLLM's own handler (a request without a session is
vLLM's), documented without a body, so it is left to the chat tests.
"""

from __future__ import annotations

import httpx
import pytest

from contract_check import findings, run_contract_check
from leyline_testkit.vllm_server import VllmServer

KEY = "contract-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed_url(checkpoint, tmp_path_factory):
    # no test hooks: the plugin as a user runs it
    with VllmServer(checkpoint, tmp_path_factory.mktemp("vllm-contract"), extra=["--api-key", KEY]) as srv:
        yield srv.base_url


@pytest.mark.parametrize("method,path", [("POST", "/sessions"), ("GET", "/sessions"), ("GET", "/sessions/s1"),
                                         ("DELETE", "/sessions/s1"), ("POST", "/directives")])
def test_session_routes_need_the_servers_key(keyed_url, method, path):
    body = {"session_id": "s1"} if path == "/sessions" and method == "POST" else None
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.request(method, keyed_url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(keyed_url + "/v1/models", timeout=30).status_code == 401  # vLLM's own check, unchanged
    assert httpx.get(keyed_url + "/healthz", timeout=30).status_code == 200  # open, as vLLM's /health


def test_generate_on_an_empty_session_is_a_conflict_in_leylines_shape(keyed_url):
    """The tiny model's chat template renders nothing without messages; vLLM would refuse the empty prompt
    in its own error shape. The plugin answers first, as the document says."""
    assert httpx.post(keyed_url + "/sessions", json={"session_id": "empty"}, headers=AUTH, timeout=30).status_code == 201
    r = httpx.post(keyed_url + "/sessions/empty/generate", json={"max_tokens": 4}, headers=AUTH, timeout=60)
    assert r.status_code == 409 and r.json()["error"]["code"] == "empty_prompt", r.text
    assert httpx.get(keyed_url + "/sessions/empty", headers=AUTH, timeout=30).json()["version"] == 0


def test_a_wrong_method_names_every_allowed_one(keyed_url):
    r = httpx.request("PUT", keyed_url + "/sessions", headers=AUTH, timeout=30)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", r.text
    assert r.headers["allow"] == "GET, POST"


def test_schemathesis_finds_nothing_on_the_plugins_routes(keyed_url, tmp_path):
    run = run_contract_check(keyed_url, tmp_path, headers=[f"Authorization: Bearer {KEY}"],
                             paths="^/(sessions|directives|healthz)")
    assert run.returncode == 0, findings(run)


def test_a_seed_is_refused_by_name_where_it_would_crash_vllms_engine(keyed_url):
    """vLLM 0.32's CPU backend crashes its engine on a seeded request whose prompt chunked prefill splits
    (``api_server/sampling.py``); CPU MLA keeps chunked prefill on with AMX (off without). Where it is on,
    Leyline's routes refuse ``seed`` by name and the document says so; elsewhere a seed is served."""
    from leyline_testkit.vllm_server import has_amx, vllm_on_cpu

    crashes = vllm_on_cpu() and has_amx()
    seed_doc = httpx.get(keyed_url + "/openapi.json", timeout=30).json()["components"]["schemas"][
        "GenerateRequest"]["properties"]["seed"]
    httpx.post(keyed_url + "/sessions", json={"session_id": "seeded", "messages": [{"role": "user", "content": "hi"}]},
               headers=AUTH, timeout=60).raise_for_status()
    r = httpx.post(keyed_url + "/sessions/seeded/generate", json={"max_tokens": 4, "seed": 7}, headers=AUTH, timeout=120)
    if crashes:
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("seed: "), r.text
        assert seed_doc["type"] == "null" and "crashes" in seed_doc["description"]
    else:
        assert r.status_code == 200, r.text
        assert seed_doc.get("type") != "null"
    assert httpx.get(keyed_url + "/healthz", timeout=30).status_code == 200
