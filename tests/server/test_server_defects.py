"""Small defects of the HTTP surface (issue 30), each against the real app and the default model.

Every test here failed before its fix: a 500 for a lone surrogate in tool-call arguments, a bare 404
without ``/v1``, a 422 silent about a missing ``Content-Type``, the session-id rule shown as a regex,
logprob tokens that did not join to the content, and OpenAI's dependent fields accepted alone.
"""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from server_support import make_runtime, torch_threads

from leyline_runtime import create_app
from leyline_sdk.protocol import SESSION_ID_PATTERN, SESSION_ID_RULE

HI = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client():
    with torch_threads(1), TestClient(create_app(runtime=make_runtime()), raise_server_exceptions=False) as http:
        yield http


def tool_exchange(arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "kv_get", "arguments": arguments}}
    return [*HI, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "8080", "tool_call_id": "c1"}]


# A JSON escape *inside* the arguments' JSON text: valid Unicode on the wire, a lone surrogate once parsed.
SURROGATE_ARGUMENTS = '{"key": "\\ud800"}'


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": tool_exchange(SURROGATE_ARGUMENTS), "max_tokens": 2}),
    ("/sessions", {"session_id": "surrogate-args", "messages": tool_exchange(SURROGATE_ARGUMENTS)}),
])
def test_a_lone_surrogate_in_tool_call_arguments_is_a_4xx_naming_it(client, path, body):
    response = client.post(path, json=body)
    assert response.status_code == (400 if path.startswith("/v1") else 422), response.text
    message = response.json()["error"]["message"]
    assert "arguments" in message and "surrogate" in message, message


def test_appending_such_arguments_to_a_session_is_a_422_and_changes_nothing(client):
    assert client.post("/sessions", json={"session_id": "surrogate-append", "messages": HI}).status_code == 201
    response = client.post("/sessions/surrogate-append/messages",
                           json={"messages": tool_exchange(SURROGATE_ARGUMENTS)[1:]})
    assert response.status_code == 422, response.text
    assert client.get("/sessions/surrogate-append").json()["num_messages"] == 1


@pytest.mark.parametrize("path", ["/chat/completions", "/models"])
def test_an_openai_path_without_v1_points_at_v1(client, path):
    response = client.request("POST" if "chat" in path else "GET", path, json={"messages": HI})
    assert response.status_code == 404
    assert f"/v1{path}" in response.json()["error"]["message"], response.text


def test_other_unknown_paths_stay_a_plain_404(client):
    response = client.get("/nowhere")
    assert response.status_code == 404 and "/v1" not in response.json()["error"]["message"]


@pytest.mark.parametrize("path,body,status", [
    ("/sessions", {"session_id": "no-ctype", "messages": HI}, 422),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2}, 400),
])
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_json_body_without_a_json_content_type_says_so(client, path, body, status, content_type):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post(path, content=json.dumps(body).encode(), headers=headers)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "Content-Type: application/json" in message, message
    assert (content_type or "no Content-Type") in message, message


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/sessions", {"session_id": ".hidden", "messages": HI}),
    ("GET", "/sessions/.hidden", None),
    ("POST", "/sessions/.hidden/messages", {"messages": HI}),
    ("POST", "/sessions", {"session_id": "x" * 129, "messages": HI}),
    ("POST", "/v1/chat/completions", {"session_id": ".hidden", "messages": HI}),
])
def test_the_session_id_rule_is_described_in_words_everywhere(client, method, path, body):
    response = client.request(method, path, json=body)
    assert response.status_code in (400, 422), response.text
    message = response.json()["error"]["message"]
    assert SESSION_ID_RULE in message and SESSION_ID_PATTERN not in message, message


def test_the_session_header_uses_the_same_words(client):
    response = client.post("/v1/chat/completions", json={"messages": HI}, headers={"X-Leyline-Session": ".x"})
    assert response.status_code == 400 and SESSION_ID_RULE in response.json()["error"]["message"]


def test_the_schema_describes_session_ids_with_the_rule(client):
    schema = client.get("/openapi.json").text
    assert SESSION_ID_RULE in schema


@pytest.mark.parametrize("fields,param", [
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
])
def test_dependent_fields_alone_are_refused_as_openai_does(client, fields, param):
    response = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_dependent_fields_with_their_switch_are_accepted(client):
    ok = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "logprobs": True,
                                                   "top_logprobs": 2})
    assert ok.status_code == 200, ok.text
    streamed = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200 and '"usage"' in streamed.text


def joined(entries: list[dict]) -> tuple[str, bytes]:
    return "".join(e["token"] for e in entries), b"".join(bytes(e["bytes"]) for e in entries)


@pytest.mark.parametrize("fields", [
    {},  # ends on the end marker, which is not content
    {"max_tokens": 5},  # ends on the budget
    {"stop": [" "], "max_tokens": 24},  # a stop string cuts the text inside a token
    {"messages": [{"role": "user", "content": "écris: déjà vu, naïve — ½ €"}], "max_tokens": 24},
])
def test_logprob_tokens_join_to_the_content(client, fields):
    body = {"messages": [{"role": "user", "content": "count: 1 2 3 4"}], "max_tokens": 16, "temperature": 0,
            "logprobs": True, "top_logprobs": 2, **fields}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    content, entries = choice["message"]["content"] or "", choice["logprobs"]["content"]
    assert entries, choice
    assert joined(entries) == (content, content.encode("utf-8")), (content, entries)
    for entry in entries:
        assert all(len(top["bytes"]) > 0 for top in entry["top_logprobs"])


def test_streamed_logprobs_join_to_the_streamed_content(client):
    body = {"messages": [{"role": "user", "content": "count: 1 2 3 4"}], "max_tokens": 16, "temperature": 0,
            "logprobs": True, "stream": True}
    chunks = [json.loads(line[6:]) for line in client.post("/v1/chat/completions", json=body).text.splitlines()
              if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    entries = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # the end marker has no entry
    assert joined(entries) == (content, content.encode("utf-8"))


def test_a_token_that_splits_a_character_carries_its_bytes():
    from server_support import default_model_and_tokenizer

    _, tokenizer = default_model_and_tokenizer()
    text = "déjà vu ½ € 漢字"
    ids = tokenizer.encode(text)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_a_stop_string_may_be_longer_than_four_characters(client):
    ok = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "stop": "hello world"})
    assert ok.status_code == 200, ok.text
    five = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "stop": list("abcde")})
    assert five.status_code == 400 and five.json()["error"]["param"] == "stop"


# Refusals the schema now states: a schema-valid request never meets one of these.
STATED_RULES = ("only assistant messages carry", "only tool messages carry", "takes a list of messages",
                "takes text or token ids", "token ids must be non-negative", "needs logprobs", "needs stream",
                "exceeded maximum size", "at most 4 items", "a session id is")
# What a schema cannot say (two fields compared, or the server's state) stays a documented 4xx.
POSITIVE_OPERATIONS = [("/v1/chat/completions", "POST"), ("/sessions", "POST"), ("/directives", "POST"),
                       ("/sessions/{session_id}/messages", "POST"), ("/sessions/{session_id}/generate", "POST")]


@pytest.mark.parametrize("path,method", POSITIVE_OPERATIONS)
def test_schema_valid_requests_never_meet_a_rule_the_schema_leaves_out(path, method):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from test_server_schema import LIMITS, VICTIM, ensure_victim, tiny_runtime

    with torch_threads(1):
        runtime = tiny_runtime()
        operation = schemathesis.openapi.from_asgi("/openapi.json", create_app(runtime=runtime, limits=LIMITS))
        operation = operation[path][method]

        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(max_examples=25, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            ensure_victim(runtime)
            if "{session_id}" in path:
                case.path_parameters = {**(case.path_parameters or {}), "session_id": VICTIM}
            response = case.call()
            if response.status_code in (400, 422):
                message = response.json()["error"]["message"]
                assert not any(rule in message for rule in STATED_RULES), (message, case.body)

        check()
