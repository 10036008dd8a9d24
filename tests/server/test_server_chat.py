"""OpenAI-compatible chat completions in-process: stateless, session-bound diffs, tools, streaming."""

from __future__ import annotations

import re
import threading

import pytest
from starlette.testclient import TestClient
from server_support import (
    history,
    make_runtime,
    metric,
    sse_events,
    torch_threads,
    user,
)

from leyline_runtime.text import chat_template as tpl
from leyline_runtime import create_app
from leyline_runtime.engine.engine import Generation
from leyline_sdk.tools_prompt import TOOLS_MESSAGE_ID
from leyline_runtime.server.streaming import DeltaDecoder

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


@pytest.fixture(scope="module")
def runtime():
    with torch_threads(1):
        yield make_runtime()


@pytest.fixture(scope="module")
def client(runtime):
    with TestClient(create_app(runtime=runtime)) as c:
        yield c


def chat(client, messages, **fields) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def session_messages(client, sid: str) -> list[dict]:
    return client.get(f"/sessions/{sid}", params={"include_messages": True}).json()["messages"]


@pytest.fixture
def scripted(runtime, monkeypatch):
    """Make the engine "generate" a given text (rows written as the real decode does, within the
    ``max_tokens`` the runtime reserved rows for)."""

    def script(text: str) -> None:
        # The model's own markup: control strings become their special tokens here (content never does).
        tok = runtime.tokenizer
        ids = []
        for piece in re.split(r"(<\|[a-z_]+\|>)", text):
            if piece in tpl.SPECIAL_TOKENS:
                ids.append(tok.token_id(piece))
            elif piece:
                ids.extend(tok.encode(piece))
        ids.append(tok.end_id)

        def decode(table, num_cached, first_logits, params, stop_ids, max_positions, decode_text=None,
                   on_token=None, processors=None):
            tokens, position = [], num_cached
            for tok in ids:
                if on_token is not None:
                    on_token(tok)
                if tok in stop_ids:
                    return Generation(tokens + [tok], "stop")
                tokens.append(tok)
                runtime.engine.prefill(table, [tok], position)
                position += 1
                if len(tokens) == params.max_tokens:
                    break
            return Generation(tokens, "length")

        monkeypatch.setattr(runtime.engine, "decode", decode)

    return script


# --- stateless --------------------------------------------------------------------------------


def test_stateless_completion_shape(client):
    before = client.get("/sessions").json()["sessions"]
    body = chat(client, [{"role": "developer", "content": "be brief"}, user("hello")], model="leyline-default")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "leyline-default"
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["completion_tokens"] <= 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert body["leyline"]["session_id"] is None
    assert client.get("/sessions").json()["sessions"] == before  # the throwaway session is gone


def test_logprobs_in_openai_shape(client):
    body = chat(client, [user("count: 1 2 3")], logprobs=True, top_logprobs=3)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) >= {"token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 3 and entry["logprob"] <= 0
        # greedy over what the request allows: logprobs are the model's own distribution, in which a
        # masked control token (no tools: no tool call, no markup) may rank first
        allowed = [t for t in entry["top_logprobs"] if t["token"] == "<|end|>" or not t["token"].startswith("<|")]
        assert entry["logprob"] == pytest.approx(allowed[0]["logprob"])


# --- bound to a session -------------------------------------------------------------------------


def test_session_edit_is_spliced_not_rebuilt(client):
    msgs = history(6)
    first = chat(client, msgs, session_id="chat-splice")
    rep = first["leyline"]
    # built here from a history whose replies this server never saw: a session served elsewhere, rebuilt
    assert (rep["built"], rep["rebuilt"], rep["rebuild_reason"]) == (True, True, "unknown_session")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    # Append-only: the whole history comes from the cache.
    msgs = [*msgs, first["choices"][0]["message"], user("next question")]
    second = chat(client, msgs, session_id="chat-splice")
    rep = second["leyline"]
    assert not rep["built"] and not rep["rebuilt"] and rep["directives_applied"] == 0 and rep["appended_messages"] == 1
    usage = second["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - rep["prefilled_tokens"]
    assert rep["prefilled_tokens"] < 10

    # Delete a middle message and resend: one amortize directive, the rest rotated.
    metrics_before = client.get("/metrics").text
    msgs = [*msgs[:2], *msgs[3:], second["choices"][0]["message"], user("and the last one")]
    third = chat(client, msgs, session_id="chat-splice")
    rep = third["leyline"]
    assert rep["directives_applied"] == 1 and rep["rebuilt"] is False
    (outcome,) = rep["outcomes"]
    assert outcome["applied_mode"] == "amortize" and outcome["delta"] < 0 and outcome["rotated_tokens"] > 0
    cached = third["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0.8 * third["usage"]["prompt_tokens"]
    metrics_after = client.get("/metrics").text
    rotated = (metric(metrics_after, "leyline_prompt_tokens_rotated_total")
               - metric(metrics_before, "leyline_prompt_tokens_rotated_total"))
    assert rotated == outcome["rotated_tokens"]
    assert metric(metrics_after, "leyline_directives_total", applied_mode="amortize") > metric(
        metrics_before, "leyline_directives_total", applied_mode="amortize")

    stored = session_messages(client, "chat-splice")
    assert [m["content"] for m in stored[:-1]] == [m["content"] for m in msgs]


def test_forget_mode_and_session_header(client):
    msgs = history(4)
    reply = chat(client, msgs, session_id="chat-forget")["choices"][0]["message"]
    edited = [msgs[0], {**msgs[1], "content": "replaced first question"}, *msgs[2:], reply]
    r = client.post("/v1/chat/completions", headers={"X-Leyline-Session": "chat-forget"},
                    json={"messages": edited, "max_tokens": 2, "leyline": {"mode": "forget"}})
    assert r.status_code == 200, r.text
    rep = r.json()["leyline"]
    assert rep["session_id"] == "chat-forget" and rep["directives_applied"] == 1
    assert rep["outcomes"][0]["requested_mode"] == rep["outcomes"][0]["applied_mode"] == "forget"
    assert rep["outcomes"][0]["recomputed_tokens"] > 0 and rep["outcomes"][0]["rotated_tokens"] == 0
    assert session_messages(client, "chat-forget")[1]["content"] == "replaced first question"


# --- tools -------------------------------------------------------------------------------------------


def test_tools_render_once_and_diff_clean(client):
    msgs = history(2)
    chat(client, msgs, session_id="chat-tools", tools=TOOLS)
    stored = session_messages(client, "chat-tools")
    assert stored[0]["id"] == TOOLS_MESSAGE_ID and stored[0]["role"] == "system"
    assert '"name": "add"' in stored[0]["content"] and tpl.TOOL_CALL in stored[0]["content"]
    # Same tools, tool_choice toggled to "none": nothing to edit, only the new turn appended.
    again = chat(client, [*msgs, {"role": "assistant", "content": stored[-1]["content"]}, user("more")],
                 session_id="chat-tools", tools=TOOLS, tool_choice="none")
    assert again["leyline"]["directives_applied"] == 0 and again["leyline"]["appended_messages"] == 1
    assert again["choices"][0]["message"]["tool_calls"] is None


def test_tool_calls_are_parsed(client, scripted):
    scripted('Let me add.<|tool_call|>{"name": "add", "arguments": {"a": 2, "b": 3}}<|end_tool_call|>')
    msgs = [user("what is 2+3?")]
    body = chat(client, msgs, session_id="chat-call", tools=TOOLS, max_tokens=64)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "add"
    assert call["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert choice["message"]["content"] == "Let me add."

    # The client sends the call and its result back: the history diffs clean.
    scripted("It is 5.")
    msgs = [*msgs, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
    body = chat(client, msgs, session_id="chat-call", tools=TOOLS, max_tokens=64)
    assert body["leyline"]["directives_applied"] == 0 and body["leyline"]["appended_messages"] == 1
    assert body["choices"][0]["message"]["content"] == "It is 5."
    assert body["choices"][0]["finish_reason"] == "stop"


def test_streamed_tool_calls(client, scripted):
    scripted('<|tool_call|>{"name": "add", "arguments": {"a": 1}}<|end_tool_call|>')
    r = client.post("/v1/chat/completions", json={"messages": [user("add")], "tools": TOOLS, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    calls = [e for e in events[:-1] if e["choices"] and "tool_calls" in e["choices"][0]["delta"]]
    assert calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "add"
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]) == ""


# --- streaming ----------------------------------------------------------------------------------------


def test_streaming_matches_non_streaming(client):
    msgs = [user("tell me a story about caches")]
    plain = chat(client, msgs, max_tokens=6)
    r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                  "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


def test_stream_errors_before_the_first_token_are_http_errors(runtime):
    with TestClient(create_app(runtime=make_runtime(max_cache_tokens=64))) as c:
        r = c.post("/v1/chat/completions", json={"messages": [user("x " * 200)], "stream": True})
        assert r.status_code == 413 and r.json()["error"]["code"] == "capacity_exceeded"


def test_delta_decoder_never_sends_past_a_stop_string(runtime):
    tok = runtime.tokenizer
    decoder = DeltaDecoder(tok, ["STOP"])
    ids = tok.encode("alpha beta STOP gamma")
    sent = "".join(decoder.push(i) for i in ids)
    assert "STOP" not in sent and "S" not in sent and sent.startswith("alpha")
    assert sent + decoder.finish("alpha beta ") == "alpha beta "
    decoder = DeltaDecoder(tok, [])
    sent = "".join(decoder.push(i) for i in tok.encode("café ✓ ok") + [tok.end_id])
    assert sent + decoder.finish("café ✓ ok") == "café ✓ ok"


def test_concurrent_chats_on_one_session_are_serialised(client):
    results: list[tuple[int, dict]] = []

    def worker(k: int) -> None:
        for step in range(2):
            msgs = [*history(3 + k), user(f"q{k}.{step}")]
            r = client.post("/v1/chat/completions", json={"messages": msgs, "session_id": "chat-race",
                                                          "max_tokens": 2, "stream": step == 1})
            results.append((r.status_code, r.text[:200]))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [status for status, _ in results] == [200] * 8, results
    info = client.get("/sessions/chat-race", params={"include_messages": True}).json()
    assert info["messages"][-1]["role"] == "assistant"
    assert info["messages"][-2]["content"].startswith("q")


def test_an_error_mid_stream_is_an_event_and_the_session_survives(client, runtime, monkeypatch):
    reply = chat(client, history(2), session_id="chat-midstream")["choices"][0]["message"]
    before = client.get("/sessions/chat-midstream").json()

    def failing_decode(table, num_cached, first_logits, params, stop_ids, max_positions, decode_text=None,
                       on_token=None, processors=None):
        for tok in runtime.tokenizer.encode("partial answer"):
            on_token(tok)
        raise ValueError("engine hiccup")

    monkeypatch.setattr(runtime.engine, "decode", failing_decode)
    r = client.post("/v1/chat/completions", json={"messages": [*history(2), reply], "session_id": "chat-midstream",
                                                  "stream": True})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[-2] == {"error": {"code": "invalid_request", "message": "engine hiccup",
                                                               "type": "invalid_request_error", "param": None}}
    assert client.get("/sessions/chat-midstream").json() == before  # the failed turn left no trace
