"""The native REST surface in-process: sessions, directives, errors, auth, limits, concurrency."""

from __future__ import annotations

import random
import threading

import pytest
from session_api_contract import contract_cases
from starlette.testclient import TestClient
from server_support import history, make_runtime, metric, torch_threads, user

from leyline_runtime import create_app
from leyline_runtime.inspection import Inspector
from leyline_runtime.runtime import RuntimeConfig
from leyline_sdk.protocol import Message


@pytest.fixture(scope="module")
def runtime():
    with torch_threads(1):
        yield make_runtime()


@pytest.fixture(scope="module")
def client(runtime):
    with TestClient(create_app(runtime=runtime)) as c:
        yield c


def new_session(client, messages=None) -> dict:
    r = client.post("/sessions", json={"messages": messages if messages is not None else history(4)})
    assert r.status_code == 201, r.text
    return r.json()


def assert_error(r, status: int, code: str) -> dict:
    """The native shape, or OpenAI's on ``/v1`` (where invalid requests are 400, not 422)."""
    assert r.status_code == status, r.text
    body = r.json()
    fields = {"message", "type", "param", "code"} if r.url.path.startswith("/v1/") else {"code", "message"}
    assert set(body) == {"error"} and set(body["error"]) == fields, body
    assert body["error"]["code"] == code, body
    return body["error"]


def snapshot(client, sid: str) -> dict:
    r = client.get(f"/sessions/{sid}", params={"include_messages": "true"})
    assert r.status_code == 200
    return r.json()


# --- happy paths --------------------------------------------------------------------------


def test_session_lifecycle(client):
    info = new_session(client, history(2))
    sid = info["session_id"]
    assert info["version"] == 1 and info["num_messages"] == 3
    assert [s["role"] for s in info["segments"]] == ["system", "user", "assistant"]
    assert info["segments"][-1]["end"] == info["num_tokens"] == info["counters"]["prefilled_tokens"]
    assert info["messages"] is None

    assert sid in [s["session_id"] for s in client.get("/sessions").json()["sessions"]]
    full = snapshot(client, sid)
    assert [m["content"] for m in full["messages"]] == [m["content"] for m in history(2)]

    r = client.post(f"/sessions/{sid}/messages", json={"messages": [user("one more")], "expected_version": 1})
    assert r.status_code == 200, r.text
    appended = r.json()
    assert appended["version"] == 2 and appended["num_messages"] == 4
    assert appended["usage"]["cached_tokens"] == info["num_tokens"]
    assert appended["usage"]["prefill_tokens"] == appended["num_tokens"] - info["num_tokens"]

    r = client.post(f"/sessions/{sid}/generate",
                    json={"messages": [user("go")], "max_tokens": 3, "temperature": 0, "logprobs": True,
                          "top_logprobs": 2})
    assert r.status_code == 200, r.text
    gen = r.json()
    assert gen["message"]["role"] == "assistant" and gen["finish_reason"] in ("stop", "length")
    # one logprob per content token (the end marker has none), and their texts join to the content
    assert len(gen["logprobs"]) <= gen["usage"]["completion_tokens"] <= 3
    assert "".join(lp["token"] for lp in gen["logprobs"]) == gen["message"]["content"]
    assert all(len(lp["top_logprobs"]) == 2 for lp in gen["logprobs"])
    assert gen["version"] == 4  # append + generate
    assert snapshot(client, sid)["num_messages"] == 6

    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert_error(client.get(f"/sessions/{sid}"), 404, "session_not_found")
    assert sid not in [s["session_id"] for s in client.get("/sessions").json()["sessions"]]


def test_directive_batch_splices(client):
    info = new_session(client, history(6))
    sid = info["session_id"]
    batch = {"session_id": sid, "expected_version": info["version"], "directives": [
        {"span": {"start": 2, "end": 3}},  # delete a middle message
        {"span": {"start": 4, "end": 5}, "replacement": [user("shorter")], "mode": "forget"},
    ]}
    r = client.post("/directives", json=batch)
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["version"] == info["version"] + 1 and result["num_messages"] == 6
    first, second = result["outcomes"]
    assert first["applied_mode"] == "amortize" and first["delta"] < 0 and first["rotated_tokens"] > 0
    assert second["applied_mode"] == "forget" and second["recomputed_tokens"] > 0
    after = snapshot(client, sid)
    assert after["num_tokens"] == result["num_tokens"]
    assert after["counters"]["rotated_tokens"] == first["rotated_tokens"]
    assert [m["content"] for m in after["messages"]][3] == "shorter"


def test_models_health_metrics_openapi(client):
    assert client.get("/healthz").json()["status"] == "ok"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "leyline-default"
    text = client.get("/metrics").text
    for name in ("leyline_prompt_tokens_prefilled_total", "leyline_prompt_tokens_rotated_total",
                 "leyline_prompt_tokens_reused_total", "leyline_prompt_tokens_recomputed_total",
                 "leyline_sessions_live", "leyline_cache_blocks_used", "leyline_cache_blocks_free",
                 "leyline_evictions_total", "leyline_directive_batch_seconds_bucket"):
        assert name in text, name
    assert metric(text, "leyline_cache_blocks_used") + metric(text, "leyline_cache_blocks_free") == 1024

    schema = client.get("/openapi.json").json()
    expected = {("/sessions", "post"), ("/sessions", "get"), ("/sessions/{session_id}", "get"),
                ("/sessions/{session_id}", "delete"), ("/sessions/{session_id}/messages", "post"),
                ("/sessions/{session_id}/generate", "post"), ("/directives", "post"),
                ("/v1/chat/completions", "post"), ("/v1/models", "get"), ("/healthz", "get"), ("/metrics", "get"),
                ("/v1/messages", "post"), ("/v1/messages/count_tokens", "post")}
    assert {(p, m) for p, ops in schema["paths"].items() for m in ops} == expected
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    for path, method in expected - {("/healthz", "get")}:
        # each surface its own error body: Anthropic's, OpenAI's, Leyline's
        status, model = (("400", "/AnthropicErrorBody") if path.startswith("/v1/messages") else
                         ("400", "/OpenAIErrorBody") if path.startswith("/v1/") else ("422", "/ErrorBody"))
        ref = schema["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith(model), (path, method)


def test_directives_metrics_by_mode(client):
    before = client.get("/metrics").text
    sid = new_session(client, history(3))["session_id"]
    r = client.post("/directives", json={"session_id": sid, "directives": [{"span": {"start": 1, "end": 2}}]})
    assert r.status_code == 200
    after = client.get("/metrics").text
    labels = {"requested_mode": "amortize", "applied_mode": "amortize", "fallback_reason": "none"}
    assert metric(after, "leyline_directives_total", **labels) == metric(before, "leyline_directives_total", **labels) + 1
    assert metric(after, "leyline_directive_batch_seconds_count") == metric(before, "leyline_directive_batch_seconds_count") + 1
    assert metric(after, "leyline_prompt_tokens_rotated_total") > metric(before, "leyline_prompt_tokens_rotated_total")


def test_engine_step_metrics_count_what_a_generation_ran(client):
    """A new session's prompt is one prefill step (or a few); its 6 generated tokens are decode steps of
    one sequence each (nothing else runs on this client's runtime meanwhile)."""
    sid = new_session(client, history(3))["session_id"]
    before = client.get("/metrics").text
    r = client.post(f"/sessions/{sid}/generate", json={"messages": [{"role": "user", "content": "And then?"}],
                                                      "max_tokens": 6, "min_tokens": 6, "temperature": 0.0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
    after = client.get("/metrics").text

    def grew(name: str, kind: str) -> float:
        return metric(after, name, kind=kind) - metric(before, name, kind=kind)

    # the last generated token's row is never computed (it may be the end marker): 5 decode steps
    assert grew("leyline_engine_steps_total", "decode") == 5
    assert grew("leyline_engine_step_sequences_total", "decode") == 5
    assert grew("leyline_engine_step_tokens_total", "decode") == 5
    assert grew("leyline_engine_step_seconds_total", "decode") > 0
    assert grew("leyline_engine_steps_total", "prefill") >= 1  # the new message and the assistant header
    assert grew("leyline_engine_steps_total", "mixed") == 0


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("check", **contract_cases())
def test_rest_contract(client, check):
    """The checks every backend passes (tests/session_api_contract.py; tests/vllm runs them on vLLM)."""
    check(client)


def test_token_spans_are_validated(client):
    sid = new_session(client)["session_id"]
    before = snapshot(client, sid)
    assert_error(client.post("/directives", json={"session_id": sid, "directives": [
        {"span": {"start": 0, "end": 3, "unit": "token"}, "replacement": "x"}]}), 422, "invalid_span")
    assert snapshot(client, sid) == before


@pytest.mark.parametrize("body,param", [  # the fields every engine checks: tests/session_api_contract.py
    ({"messages": [user("x")], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_v1_validation_errors_are_openai_400s_naming_the_field(client, body, param):
    err = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request")
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]


def test_v1_min_tokens_above_max_tokens_is_a_400(client):
    for body in ({"max_tokens": 4, "min_tokens": 5}, {"min_tokens": 257}):  # 256: the default max_tokens
        r = client.post("/v1/chat/completions", json={"messages": [user("x")], **body})
        assert_error(r, 400, "invalid_request")
        assert "min_tokens" in r.json()["error"]["message"]


def test_malformed_json_unknown_paths_and_methods(client):
    r = client.post("/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert assert_error(r, 400, "invalid_body")["message"].startswith("the body is not valid JSON")
    assert_error(client.get("/no/such/path"), 404, "not_found")
    assert_error(client.put("/sessions"), 405, "method_not_allowed")


def test_token_ids_outside_the_vocabulary_are_422_not_500(client):
    sid = new_session(client, [user("hello there friend")])["session_id"]
    r = client.post("/directives", json={"session_id": sid, "directives": [
        {"span": {"start": 1, "end": 2, "unit": "token"}, "replacement": [10**12]}]})
    assert r.status_code == 422, r.text


# --- auth and tenants ----------------------------------------------------------------------


def test_api_keys_and_tenant_isolation(runtime):
    with TestClient(create_app(RuntimeConfig(api_keys=["key-a", "key-b"]), runtime=runtime)) as c:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        assert c.get("/healthz").status_code == 200
        assert_error(c.get("/sessions"), 401, "unauthorized")
        assert_error(c.get("/sessions", headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
        assert_error(c.get("/metrics"), 401, "unauthorized")
        assert_error(c.post("/v1/chat/completions", json={"messages": [user("x")]}), 401, "unauthorized")

        r = c.post("/sessions", json={"session_id": "shared-name", "messages": history(2)}, headers=a)
        assert r.status_code == 201
        sid = r.json()["session_id"]
        assert [s["session_id"] for s in c.get("/sessions", headers=b).json()["sessions"]] == []
        assert_error(c.get(f"/sessions/{sid}", headers=b), 404, "session_not_found")
        assert_error(c.post(f"/sessions/{sid}/messages", json={"messages": [user("x")]}, headers=b),
                     404, "session_not_found")
        assert_error(c.post(f"/sessions/{sid}/generate", json={"max_tokens": 1}, headers=b), 404, "session_not_found")
        assert_error(c.post("/directives", json={"session_id": sid, "directives": [{"span": {"start": 0, "end": 1}}]},
                            headers=b), 404, "session_not_found")
        assert_error(c.delete(f"/sessions/{sid}", headers=b), 404, "session_not_found")
        # The same name is B's own, separate session.
        r = c.post("/sessions", json={"session_id": sid, "messages": [user("b's")]}, headers=b)
        assert r.status_code == 201 and r.json()["num_messages"] == 1
        assert c.get(f"/sessions/{sid}", headers=a).json()["num_messages"] == 3
        # The un-keyed default tenant of another app on the same runtime cannot see either.
        with TestClient(create_app(runtime=runtime)) as open_client:
            assert_error(open_client.get(f"/sessions/{sid}"), 404, "session_not_found")
        assert c.delete(f"/sessions/{sid}", headers=a).status_code == 204
        assert c.delete(f"/sessions/{sid}", headers=b).status_code == 204


def test_api_keys_from_environment(runtime, monkeypatch):
    monkeypatch.setenv("LEYLINE_API_KEYS", "env-1, env-2")
    with TestClient(create_app(runtime=runtime)) as c:
        assert_error(c.get("/sessions"), 401, "unauthorized")
        assert c.get("/sessions", headers={"Authorization": "Bearer env-2"}).status_code == 200


# --- capacity and eviction -------------------------------------------------------------------


def test_request_larger_than_the_cache_is_413():
    with TestClient(create_app(runtime=make_runtime(max_cache_tokens=64))) as c:
        big = [user("lorem ipsum " * 80)]
        assert_error(c.post("/sessions", json={"messages": big}), 413, "capacity_exceeded")
        assert_error(c.post("/v1/chat/completions", json={"messages": big, "max_tokens": 2}), 413, "capacity_exceeded")
        assert_error(c.post("/v1/chat/completions", json={"messages": big, "max_tokens": 2, "stream": True}),
                     413, "capacity_exceeded")
        assert c.get("/sessions").json()["sessions"] == []  # nothing half-made


def test_idle_session_is_evicted_then_rebuilt_by_chat():
    with TestClient(create_app(runtime=make_runtime(max_cache_tokens=512))) as c:
        msgs_a = history(5, words=6)
        r = c.post("/v1/chat/completions", json={"messages": msgs_a, "session_id": "A", "max_tokens": 2,
                                                 "temperature": 0})
        assert r.status_code == 200, r.text
        reply = r.json()["choices"][0]["message"]
        assert c.post("/sessions", json={"session_id": "B", "messages": history(11, words=8)}).status_code == 201

        err = assert_error(c.get("/sessions/A"), 404, "session_not_found")
        assert "evicted" in err["message"]
        assert metric(c.get("/metrics").text, "leyline_evictions_total") >= 1

        resend = [*msgs_a, reply, user("and now?")]
        r = c.post("/v1/chat/completions", json={"messages": resend, "session_id": "A", "max_tokens": 2})
        assert r.status_code == 200, r.text
        rep = r.json()["leyline"]
        assert (rep["built"], rep["rebuilt"], rep["rebuild_reason"]) == (True, True, "evicted")
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        rebuilt = c.get("/sessions/A", params={"include_messages": True}).json()
        assert [m["content"] for m in rebuilt["messages"][:-1]] == [m["content"] or "" for m in resend]


@pytest.mark.parametrize("mode", ["forget", "amortize"])
def test_an_outcome_counts_the_kept_prefix_as_reused(client, mode):
    info = new_session(client, history(6))
    r = client.post("/directives", json={"session_id": info["session_id"], "directives": [
        {"span": {"start": 4, "end": 5}, "replacement": [user("shorter")], "mode": mode}]})
    assert r.status_code == 200, r.text
    result = r.json()
    (outcome,) = result["outcomes"]
    assert outcome["token_start"] > 0
    assert outcome["reused_tokens"] == outcome["token_start"]  # the rows before the edit, kept bit for bit
    assert outcome["reused_tokens"] + outcome["rotated_tokens"] + outcome["recomputed_tokens"] == result["num_tokens"]


# --- concurrency ---------------------------------------------------------------------------------


def test_one_lock_per_session(client, runtime):
    """The service serialises a chat turn with the lock the runtime takes for every call on the session."""
    assert client.app.state.chat.session_locks is runtime.session_locks
    sid = new_session(client)["session_id"]
    held = threading.Event()
    done = threading.Event()

    def hold_then_release():
        with runtime.session_locks.hold(("default", sid)):
            held.set()
            done.wait(5)

    t = threading.Thread(target=hold_then_release)
    t.start()
    held.wait(5)
    appended = []
    worker = threading.Thread(target=lambda: appended.append(runtime.append(sid, [Message(role="user", content="x")])))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and not appended  # the runtime's own call waits for the session's one lock
    done.set()
    t.join(5)
    worker.join(30)
    assert appended and appended[0].version == 2


def test_concurrent_directives_and_generations_on_one_session(client, runtime):
    sid = new_session(client, history(3))["session_id"]
    seen: dict[int, list[int]] = {}
    failures: list[str] = []

    def worker(k: int) -> None:
        rng = random.Random(k)
        versions = seen.setdefault(k, [])
        for step in range(4):
            kind = (k + step) % 3
            if kind == 0:
                r = client.post(f"/sessions/{sid}/generate", json={"messages": [user(f"t{k}.{step}")],
                                                                  "max_tokens": 2, "temperature": 0})
            elif kind == 1:
                words = " ".join(f"r{k}{step}x{j}" for j in range(rng.randint(0, 12)))
                r = client.post("/directives", json={"session_id": sid, "directives": [
                    {"span": {"start": 1, "end": 2}, "replacement": [user(words)]}]})
            else:
                r = client.post("/directives", json={"session_id": sid, "directives": [
                    {"span": {"start": 1, "end": 1}, "replacement": [user(f"ins{k}.{step}")], "mode": "forget"}]})
            if r.status_code != 200:
                failures.append(r.text)
                return
            versions.append(r.json()["version"])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for versions in seen.values():
        assert versions == sorted(set(versions))  # each client sees its own steps strictly in order
    every = [v for vs in seen.values() for v in vs]
    assert len(every) == len(set(every))  # no two mutations share a version
    final = snapshot(client, sid)
    assert final["version"] == max(every)

    messages = [Message.model_validate(m) for m in final["messages"]]
    fresh = [t for toks in runtime.tokenizer.encode_messages(messages) for t in toks]
    assert Inspector(runtime).tokens(sid) == fresh
    # exactly the blocks its tokens need: nothing a failed or concurrent step took was kept
    assert len(Inspector(runtime).block_ids(sid)) == -(-len(fresh) // runtime.config.block_size)
    assert final["segments"][-1]["end"] == final["num_tokens"] == len(fresh)
