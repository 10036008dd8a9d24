"""Anthropic's Messages API on ``vllm serve`` + the plugin, as the ``anthropic`` SDK calls it, and
``context_management`` on both of the plugin's bound routes.

Bound to a session (``X-Leyline-Session``), a Messages request is the plugin's bound chat turn
(``api_server/messages.py``); without one, the same turn on the held session its history continues
(or a new one), unless it asks what the plugin refuses: then vLLM's own. Each test owns its text (a
unique tag in the history): vLLM's prefix cache may serve rows other tests computed.
"""

from __future__ import annotations

import uuid

import anthropic
import httpx
import pytest

from leyline_runtime.api.context_edits import PLACEHOLDER
from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer

KEY = "messages-test-key"
GREEDY = {"extra_body": {"temperature": 0}}  # the SDK's signature no longer names it; the API takes it
CLEAR = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
                    "keep": {"type": "tool_uses", "value": 1}}]}


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _client(base_url: str, sid: str | None = None, **kw) -> anthropic.Anthropic:
    headers = {"X-Leyline-Session": sid} if sid else {}
    return anthropic.Anthropic(base_url=base_url, api_key=kw.pop("api_key", "unused"), default_headers=headers,
                               timeout=600, max_retries=0, **kw)


def _session(base_url: str, sid: str) -> dict:
    r = httpx.get(f"{base_url}/sessions/{sid}", params={"include_messages": "true"}, timeout=60)
    r.raise_for_status()
    return r.json()


def _prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def _tool_history(tag: str, uses: int) -> list[dict]:
    """A user's question, then ``uses`` tool round trips: an assistant tool_use, the user's tool_result."""
    out: list[dict] = [{"role": "user", "content": f"[{tag}] Read the river gauges, one station at a time."}]
    for i in range(uses):
        out.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading station {i}."},
            {"type": "tool_use", "id": f"toolu_{tag}_{i}", "name": "gauge", "input": {"station": i}}]})
        out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{tag}_{i}",
                                                 "content": f"station {i} [{tag}]: " + "level 4.2 m, rising; " * 12}]})
    return out


TOOLS = [{"name": "gauge", "description": "A river gauge's reading", "input_schema": {
    "type": "object", "properties": {"station": {"type": "integer"}}, "required": ["station"]}}]


def test_a_bound_message_and_its_next_turn_reuse_the_session(base_url, block):
    tag, sid = _tag(), f"msg-{_tag()}"
    client = _client(base_url, sid)
    history = [{"role": "user", "content": f"[{tag}] The Loire runs past Orleans, Blois and Tours to Nantes."}]
    # a system prompt of some blocks: rows are reused in whole blocks
    system = f"You keep short notes about rivers [{tag}]: " + "their towns, bridges, tributaries and floods; " * 8
    first = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=8, **GREEDY, messages=history, system=system)
    report = first.model_extra["leyline"]
    assert first.role == "assistant" and first.stop_reason in ("end_turn", "max_tokens"), first
    assert report["session_id"] == sid and report["built"] and first.usage.input_tokens == 0  # kept: a session
    assert first.usage.output_tokens >= 1
    held = _session(base_url, sid)["messages"]
    assert [m["role"] for m in held] == ["system", "user", "assistant"]
    assert held[-1]["content"] == "".join(b.text for b in first.content if b.type == "text")

    history += [{"role": "assistant", "content": [b.model_dump() for b in first.content] or "..."},
                {"role": "user", "content": f"[{tag}] Which town is furthest downstream?"}]
    ask = dict(model=SERVED_MODEL_NAME, messages=history, system=system)
    count = client.messages.count_tokens(**ask)
    second = client.messages.create(max_tokens=8, **GREEDY, **ask)
    report = second.model_extra["leyline"]
    assert not report["built"] and report["directives_applied"] == 0 and report["appended_messages"] == 1, report
    # the count is the prompt the turn ran; the first prompt's rows were read back from the session
    assert _prompt_tokens(second.usage) == count.input_tokens
    first_prompt = _prompt_tokens(first.usage)
    assert second.usage.cache_read_input_tokens >= first_prompt - first_prompt % block > 0


def test_a_bound_stream_is_anthropics_event_sequence(base_url):
    tag, sid = _tag(), f"msg-stream-{_tag()}"
    with _client(base_url, sid).messages.stream(
            model=SERVED_MODEL_NAME, max_tokens=6, **GREEDY,
            messages=[{"role": "user", "content": f"[{tag}] Name a river."}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds, kinds
    delta = next(e for e in events if e.type == "message_delta")  # the leyline report rides on it
    assert delta.model_extra["leyline"]["session_id"] == sid and final.usage.output_tokens >= 1
    assert final.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in final.content if b.type == "text")
    assert _session(base_url, sid)["messages"][-1]["content"] == text


def test_a_stop_sequence_is_named(base_url):
    # common characters: the tiny random model's greedy text holds one soon (as test_vllm_stop_strings)
    stops = [" ", "e", "a", "o"]
    reply = _client(base_url, f"msg-stop-{_tag()}").messages.create(
        model=SERVED_MODEL_NAME, max_tokens=160, **GREEDY, stop_sequences=stops,
        messages=[{"role": "user", "content": f"[{_tag()}] Describe the estuary."}])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence in stops, reply


def test_a_tool_use_round_trip(base_url):
    tag, sid = _tag(), f"msg-tools-{_tag()}"
    history = _tool_history(tag, 1)
    history[-1]["content"][0]["is_error"] = True
    history[-1]["content"].append({"type": "text", "text": "Try the next station."})
    reply = _client(base_url, sid).messages.create(model=SERVED_MODEL_NAME, max_tokens=8, **GREEDY,
                                                   tools=TOOLS, tool_choice={"type": "auto"}, messages=history)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use"), reply
    assert all(b.type == "tool_use" for b in reply.content if b.type != "text")
    held = _session(base_url, sid)["messages"]
    # the tools prompt, the question, the call, its (failed) result, the user's text, the reply
    assert [m["role"] for m in held] == ["system", "user", "assistant", "tool", "user", "assistant"], held
    call = held[2]["tool_calls"][0]
    assert call["id"] == f"toolu_{tag}_0" and call["function"]["name"] == "gauge"
    assert held[3]["tool_call_id"] == f"toolu_{tag}_0" and held[3]["content"].startswith("Error: station 0")


def test_a_clear_becomes_directives_and_applied_edits_are_exact(base_url):
    tag, sid = _tag(), f"msg-clear-{_tag()}"
    client = _client(base_url, sid)
    history = _tool_history(tag, 4)
    ask = dict(model=SERVED_MODEL_NAME, tools=TOOLS, system=f"You read gauges [{tag}].")
    first = client.messages.create(max_tokens=4, **GREEDY, messages=history, **ask)
    assert (first.model_extra or {}).get("context_management") is None
    history += [{"role": "assistant", "content": [b.model_dump() for b in first.content] or "..."},
                {"role": "user", "content": f"[{tag}] Summarise the readings."}]

    count = client.beta.messages.count_tokens(messages=history, context_management=CLEAR, **ask)
    second = client.beta.messages.create(max_tokens=4, **GREEDY, messages=history, context_management=CLEAR,
                                         **ask)
    applied = second.context_management.applied_edits
    assert len(applied) == 1 and applied[0].type == "clear_tool_uses_20250919" and applied[0].cleared_tool_uses == 3
    freed = count.context_management.original_input_tokens - count.input_tokens
    assert applied[0].cleared_input_tokens == freed > 0
    report = second.model_extra["leyline"]
    # each newly cleared result is one directive on the session, applied by the server's policy
    assert report["directives_applied"] == 3 and len(report["outcomes"]) == 3, report
    assert {o["requested_mode"] for o in report["outcomes"]} == {"amortize"}
    tools = [m["content"] for m in _session(base_url, sid)["messages"] if m["role"] == "tool"]
    assert tools[:3] == [PLACEHOLDER] * 3 and tools[3].startswith("station 3")
    assert _prompt_tokens(second.usage) == count.input_tokens

    # the client sends its whole history again: the same edit, already made, is no new directive
    history += [{"role": "assistant", "content": [b.model_dump() for b in second.content] or "..."},
                {"role": "user", "content": f"[{tag}] And the trend?"}]
    third = client.beta.messages.create(max_tokens=4, **GREEDY, messages=history, context_management=CLEAR,
                                        **ask)
    assert third.context_management.applied_edits[0].cleared_tool_uses == 3
    assert third.model_extra["leyline"]["directives_applied"] == 0


def test_the_bound_chat_takes_context_management(base_url):
    tag, sid = _tag(), f"chat-clear-{_tag()}"
    messages = [{"role": "user", "content": f"[{tag}] Check three gauges."}]
    for i in range(3):
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{tag}_{i}", "type": "function",
                      "function": {"name": "gauge", "arguments": f'{{"station": {i}}}'}}]},
                     {"role": "tool", "tool_call_id": f"call_{tag}_{i}", "content": f"station {i} [{tag}]: dry"}]

    def chat(extra: dict) -> dict:
        r = httpx.post(f"{base_url}/v1/chat/completions", headers={"X-Leyline-Session": sid}, timeout=600,
                       json={"messages": messages, "max_tokens": 4, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    first = chat({})
    assert first["context_management"] is None
    messages += [{k: v for k, v in first["choices"][0]["message"].items() if v is not None},
                 {"role": "user", "content": f"[{tag}] Now clear the old ones."}]
    reply = chat({"context_management": CLEAR})
    edit = reply["context_management"]["applied_edits"][0]
    assert edit["cleared_tool_uses"] == 2 and edit["cleared_input_tokens"] > 0
    assert reply["leyline"]["directives_applied"] == 2, reply["leyline"]
    assert [o["requested_mode"] for o in reply["leyline"]["outcomes"]] == ["amortize", "amortize"]


def test_errors_are_the_sdks_typed_exceptions_and_change_nothing(base_url):
    tag, sid = _tag(), f"msg-err-{_tag()}"
    client = _client(base_url, sid)
    client.messages.create(model=SERVED_MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": tag}])
    version = _session(base_url, sid)["version"]
    history = [{"role": "user", "content": tag}]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="no-such-model", max_tokens=2, messages=history)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as err:  # no constrained decoding on the plugin
        client.messages.create(model=SERVED_MODEL_NAME, max_tokens=2, messages=history, tools=TOOLS,
                               tool_choice={"type": "any"})
    assert "tool_choice" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=SERVED_MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}])
    assert err.value.body["error"]["type"] == "invalid_request_error" and "image" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        _client(base_url, "not a session id!").messages.create(model=SERVED_MODEL_NAME, max_tokens=2,
                                                               messages=history)
    assert _session(base_url, sid)["version"] == version


def _sent_back(reply) -> list[dict] | str:
    """The reply as the client's next request carries it (an empty reply: empty text)."""
    return [b.model_dump() for b in reply.content] or ""


def test_without_a_session_the_history_continues_its_held_session(base_url, block):
    tag = _tag()
    client = _client(base_url)  # no X-Leyline-Session: as Anthropic's clients call
    system = f"You keep short notes about rivers [{tag}]: " + "their towns, bridges, tributaries and floods; " * 8
    history = [{"role": "user", "content": f"[{tag}] The Rhone runs from its glacier through Geneva to Arles."}]
    first = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=8, **GREEDY, messages=history, system=system)
    report = first.model_extra["leyline"]
    assert report["session_id"].startswith("continued_") and report["built"], report  # a miss: a new session

    history += [{"role": "assistant", "content": _sent_back(first)},
                {"role": "user", "content": f"[{tag}] Which city is furthest downstream?"}]
    second = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=8, **GREEDY, messages=history,
                                    system=system)
    report = second.model_extra["leyline"]
    assert report["session_id"] == first.model_extra["leyline"]["session_id"], report
    assert not report["built"] and report["directives_applied"] == 0 and report["appended_messages"] == 1, report
    # the first turn's prompt's rows were read back from the session, not computed again
    first_prompt = _prompt_tokens(first.usage)
    assert second.usage.cache_read_input_tokens >= first_prompt - first_prompt % block > 0, second.usage
    held = _session(base_url, report["session_id"])["messages"]
    assert [m["role"] for m in held] == ["system", "user", "assistant", "user", "assistant"], held

    # streamed (as Claude Code calls), the third turn continues the same session
    history += [{"role": "assistant", "content": _sent_back(second)},
                {"role": "user", "content": f"[{tag}] And the longest tributary?"}]
    with client.messages.stream(model=SERVED_MODEL_NAME, max_tokens=4, **GREEDY, messages=history,
                                system=system) as stream:
        delta = next(e for e in stream if e.type == "message_delta")
    assert delta.model_extra["leyline"]["session_id"] == report["session_id"], delta


def test_a_history_that_continues_nothing_gets_a_new_session(base_url):
    tag = _tag()
    client = _client(base_url)
    history = [{"role": "user", "content": f"[{tag}] Name the bridges of Lyon."}]
    first = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=4, **GREEDY, messages=history)
    held = first.model_extra["leyline"]["session_id"]
    follow_up = [{"role": "assistant", "content": _sent_back(first)}, {"role": "user", "content": f"[{tag}] More?"}]

    # the client edited its own history: no held session's history starts it
    edited = [{"role": "user", "content": f"[{tag}] Name the bridges of Lyon, north to south."}, *follow_up]
    # another client user (metadata.user_id scopes the look-up): not this session either
    for ask in (dict(messages=edited), dict(messages=history + follow_up, metadata={"user_id": f"other-{tag}"})):
        reply = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=4, **GREEDY, **ask)
        report = reply.model_extra["leyline"]
        assert report["session_id"].startswith("continued_") and report["session_id"] != held, report
        assert report["built"] and report["rebuild_reason"] == "unknown_session", report
    # a miss took nothing: the history that continues the first session still finds it
    reply = client.messages.create(model=SERVED_MODEL_NAME, max_tokens=4, **GREEDY, messages=history + follow_up)
    assert reply.model_extra["leyline"]["session_id"] == held and not reply.model_extra["leyline"]["built"]


def _held(base_url: str) -> set[str]:
    r = httpx.get(f"{base_url}/sessions", timeout=60)
    r.raise_for_status()
    return {s["session_id"] for s in r.json()["sessions"]}


def test_an_unbound_request_the_plugin_refuses_is_vllms_own(base_url):
    # tool_choice any needs constrained decoding, which the plugin's turn refuses (a 400 naming the
    # session-bound chat when bound: test_errors_...). Without a session header it is vLLM's own handler's,
    # as without the plugin: on this folder's servers (no --tool-call-parser) that is vLLM's own 400.
    ask = dict(model=SERVED_MODEL_NAME, max_tokens=8, tools=TOOLS, tool_choice={"type": "any"},
               messages=[{"role": "user", "content": f"[{_tag()}] Read station 3."}])
    before = _held(base_url)
    with pytest.raises(anthropic.BadRequestError) as err:
        _client(base_url).messages.create(**ask)
    message = str(err.value)  # the SDK's: the body's message
    assert "--tool-call-parser" in message and "session-bound" not in message, message
    assert _held(base_url) == before  # no session was made for it
    count = _client(base_url).messages.count_tokens(model=SERVED_MODEL_NAME, messages=ask["messages"])
    assert count.input_tokens > 0  # count_tokens without the header: vLLM's own too


@pytest.fixture(scope="module")
def keyed_url(checkpoint, tmp_path_factory):
    with VllmServer(checkpoint, tmp_path_factory.mktemp("vllm-messages-key"), extra=["--api-key", KEY]) as srv:
        yield srv.base_url


def test_the_key_as_x_api_key_or_bearer(keyed_url):
    ask = dict(model=SERVED_MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": f"[{_tag()}] hi"}])
    sid = f"msg-key-{_tag()}"
    bound = _client(keyed_url, sid, api_key=KEY).messages.create(**ask)  # x-api-key, as the SDK sends it
    assert bound.model_extra["leyline"]["session_id"] == sid
    # no header: the key (as x-api-key) is the continuation's tenant, and a new session for this history
    assert _client(keyed_url, api_key=KEY).messages.create(**ask).model_extra["leyline"]["session_id"].startswith(
        "continued_")
    bearer = anthropic.Anthropic(base_url=keyed_url, auth_token=KEY, default_headers={"X-Leyline-Session": sid},
                                 max_retries=0, timeout=600)
    assert bearer.messages.count_tokens(model=SERVED_MODEL_NAME, messages=ask["messages"]).input_tokens > 0
    for client in (_client(keyed_url, sid, api_key="wrong"), _client(keyed_url, api_key="wrong")):
        with pytest.raises(anthropic.AuthenticationError) as err:
            client.messages.create(**ask)
        assert err.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                             "message": "invalid API key"}}
    # elsewhere vLLM's check is unchanged: x-api-key is no key there
    assert httpx.get(f"{keyed_url}/v1/models", headers={"x-api-key": KEY}, timeout=30).status_code == 401


def test_the_document_describes_the_messages_routes(base_url):
    doc = httpx.get(f"{base_url}/openapi.json", timeout=60).json()
    for path, reply in (("/v1/messages", "MessageReply"), ("/v1/messages/count_tokens", "TokenCount")):
        responses = doc["paths"][path]["post"]["responses"]
        assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith(reply), responses
        assert responses["401"]["content"]["application/json"]["schema"]["$ref"].endswith("AnthropicErrorBody")
    usage = doc["components"]["schemas"]["MessagesUsage"]["properties"]
    assert {"cache_read_input_tokens", "cache_creation_input_tokens"} <= set(usage)


def test_a_call_whose_arguments_are_not_an_object_is_answered_under_arguments():
    """No server: nothing constrains a tool call's arguments on vLLM, and a ``tool_use`` input must be an object."""
    from leyline_runtime.api.messages_response import MessagesTurn, message_reply
    from leyline_sdk.protocol import FunctionCall, GenerateResponse, Message, ToolCall, Usage
    from leyline_vllm.api_server.messages import _object_inputs
    from leyline_vllm.api_server.service import VllmTurn

    calls = [ToolCall(id=i, function=FunctionCall(name="gauge", arguments=a))
             for i, a in (("a", '{"station": 1}'), ("b", "[1, 2]"), ("c", "not json"))]
    response = GenerateResponse(session_id="s", message=Message(role="assistant", content="", tool_calls=calls),
                                finish_reason="tool_calls", version=2, usage=Usage(
                                    prompt_tokens=3, cached_tokens=0, completion_tokens=2, total_tokens=5, prefill_tokens=3))
    reply = message_reply(MessagesTurn(_object_inputs(VllmTurn(response))), "msg_1", SERVED_MODEL_NAME)
    assert [b.input for b in reply.content] == [{"station": 1}, {"arguments": [1, 2]}, {"arguments": "not json"}]
    assert reply.stop_reason == "tool_use"
