"""Anthropic's Messages API on a real ``leyline-runtime serve`` (the embedded default model), through the
real ``anthropic`` SDK: sync, async and streamed calls, a tool-use loop bound to a session, stop
sequences, ``count_tokens``, ``context_management`` and errors as the SDK's typed exceptions.

This SDK no longer sends ``temperature``; greedy decoding is asked through ``extra_body``.
"""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import pytest
from served_runtime import ADMIN_KEY, API_KEY, server  # noqa: F401 - server is a fixture

from leyline_sdk.protocol import SESSION_HEADER

MODEL = "leyline-default"
GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "Say hi"}]
CALCULATOR = {"name": "calculator", "description": "Evaluate an arithmetic expression",
              "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                               "required": ["expression"]}}
QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]


@pytest.fixture(scope="module")
def client(server):  # noqa: F811 - the fixture
    url, _ = server
    return anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0)


def create(client, **fields):
    fields.setdefault("messages", HELLO)
    fields.setdefault("max_tokens", 6)
    return client.messages.create(model=MODEL, extra_body={**GREEDY, **fields.pop("extra_body", {})}, **fields)


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_create_answers_a_message_whose_usage_is_the_prompt_count_tokens_gives(client):
    reply = create(client)
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and 0 < reply.usage.output_tokens <= 6
    # no session named and none held that this history continues: a new one, everything computed and kept
    assert reply.usage.cache_read_input_tokens == reply.usage.input_tokens == 0
    assert reply.model_extra["leyline"]["built"] and reply.model_extra["leyline"]["session_id"]
    assert prompt_tokens(reply.usage) == client.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens


def test_async_create_and_bearer_auth_answer_as_sync_does(server, client):  # noqa: F811
    url, _ = server
    expected = create(client).content[0].text

    async def ask():
        async with anthropic.AsyncAnthropic(base_url=url, auth_token=API_KEY, max_retries=0) as aclient:
            return await aclient.messages.create(model=MODEL, max_tokens=6, messages=HELLO, extra_body=GREEDY)

    assert asyncio.run(ask()).content[0].text == expected


def test_stream_deltas_add_up_to_the_final_message(client):
    with client.messages.stream(model=MODEL, max_tokens=6, messages=HELLO, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = create(client)
    assert final.content[0].text == text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)


def test_a_streamed_tool_use_arrives_as_input_json_deltas(client):
    fields = {"model": MODEL, "max_tokens": 48, "messages": QUESTION, "tools": [CALCULATOR],
              "tool_choice": {"type": "any"}, "extra_body": GREEDY}
    with client.messages.stream(**fields) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds
    whole = client.messages.create(**fields)
    assert final.stop_reason == whole.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (b.type, b.name, b.input) for b in whole.content]


def test_stop_sequences_end_the_reply_and_are_named(client):
    text = create(client, max_tokens=12).content[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    reply = create(client, max_tokens=12, stop_sequences=[stop])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == text[:text.index(stop)]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "calculator"}])
def test_a_tool_use_loop_bound_to_a_session_reuses_its_cache(client, choice):
    session = f"anthropic-loop-{choice['type']}"
    bound = {"extra_headers": {SESSION_HEADER: session}}
    first = create(client, messages=QUESTION, tools=[CALCULATOR], tool_choice=choice, max_tokens=48, **bound)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["tool_use"]
    call = first.content[0]
    assert call.name == "calculator" and isinstance(call.input["expression"], str)
    assert first.usage.cache_creation_input_tokens > 0 and first.usage.input_tokens == 0
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "391"}
    history = [*QUESTION, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [result]}]
    second = create(client, messages=history, tools=[CALCULATOR], tool_choice=choice, max_tokens=48, **bound)
    assert second.stop_reason == "tool_use" and second.content[0].name == "calculator"
    report = second.model_extra["leyline"]
    # the session held the first turn as the history repeats it: nothing to edit, the result appended
    assert report["session_id"] == session and report["directives_applied"] == 0 and report["appended_messages"] == 1
    assert second.usage.cache_read_input_tokens >= prompt_tokens(first.usage)
    assert prompt_tokens(second.usage) == client.messages.count_tokens(
        model=MODEL, messages=history, tools=[CALCULATOR], tool_choice=choice).input_tokens


def _tool_history(results: list[str]) -> list[dict]:
    history: list[dict] = [QUESTION[0]]
    for i, text in enumerate(results):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "calculator", "input": {"expression": f"{i} + 1"}}
        history += [{"role": "assistant", "content": [use]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": text, "is_error": i == 0}]}]
    return history


def test_context_management_clears_old_tool_results_as_directives_on_the_session(client):
    bound = {"extra_headers": {SESSION_HEADER: "anthropic-clearing", "anthropic-beta": "context-management-2025-06-27"}}
    history = _tool_history(["a long first result " * 8, "a long second result " * 8, "third"])
    first = create(client, messages=history, tools=[CALCULATOR], **bound)
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": "go on"}]
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": [], "clear_tool_inputs": False}
    reply = create(client, messages=history, tools=[CALCULATOR], extra_body={"context_management": {"edits": [edit]}},
                   **bound)
    applied = reply.model_extra["context_management"]["applied_edits"]
    assert [(e["type"], e["cleared_tool_uses"]) for e in applied] == [("clear_tool_uses_20250919", 2)]
    assert applied[0]["cleared_input_tokens"] > 0
    report = reply.model_extra["leyline"]
    assert report["directives_applied"] == 2 and len(report["outcomes"]) == 2
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=[CALCULATOR],
                                           extra_body={"context_management": {"edits": [edit]}})
    assert counted.input_tokens == prompt_tokens(reply.usage)
    assert counted.context_management["original_input_tokens"] == counted.input_tokens + applied[0][
        "cleared_input_tokens"]


def test_another_key_never_continues_a_session_it_does_not_own(server, client):  # noqa: F811
    url, _ = server
    bound = {"extra_headers": {SESSION_HEADER: "anthropic-owned"}}
    first = create(client, **bound)
    history = [*HELLO, {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "more"}]
    other = anthropic.Anthropic(base_url=url, api_key=ADMIN_KEY, max_retries=0)  # a tenant of its own
    report = create(other, messages=history, **bound).model_extra["leyline"]
    # the other key's tenant holds no such session: built from its own history, nothing reused
    assert report["built"] and report["rebuild_reason"] == "unknown_session"
    owner = create(client, messages=history, **bound)
    assert not owner.model_extra["leyline"]["built"] and owner.usage.cache_read_input_tokens > 0


def test_errors_arrive_as_the_sdks_exceptions(server, client):  # noqa: F811
    url, _ = server
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=HELLO)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-nonexistent", max_tokens=4, messages=HELLO)
    assert err.value.body["error"]["type"] == "not_found_error" and "claude-nonexistent" in err.value.message
    bad = [({"temperature": 1.5}, "temperature"), ({"top_k": -1}, "top_k"), ({"thinking_budget": 3}, "thinking_budget"),
           ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
           ({"tool_choice": {"type": "any"}}, "tool_choice")]
    for fields, param in bad:
        with pytest.raises(anthropic.BadRequestError) as err:
            create(client, extra_body=fields)
        assert err.value.body["error"]["type"] == "invalid_request_error" and param in err.value.message, fields
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[])


def test_the_routes_are_in_the_openapi_document(server):  # noqa: F811
    url, _ = server
    doc = httpx.get(f"{url}/openapi.json").json()
    schemes = {name: s.get("name") for name, s in doc["components"]["securitySchemes"].items()}
    for path, body in (("/v1/messages", "MessagesRequest"), ("/v1/messages/count_tokens", "MessagesPrompt")):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(body)
        assert {"200", "400", "401", "404", "413"} <= set(op["responses"])
        # the key as Anthropic's clients send it, or as a Bearer token
        assert {schemes[name] for req in op["security"] for name in req} == {None, "x-api-key"}
    create_op = doc["paths"]["/v1/messages"]["post"]
    assert SESSION_HEADER in [p["name"] for p in create_op["parameters"]]
    assert "held session whose history" in create_op["description"]  # the binding without the header
