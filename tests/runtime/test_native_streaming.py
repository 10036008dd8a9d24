"""Token-by-token streaming on the session-native path: runtime SSE, SDK, memory, ChatLeyline.

The real runtime (default model) in-process. What must hold whatever the weights
write: the streamed text deltas add up to the reply the session stores, the last
event carries the parsed reply (tool calls, usage, version), a reply of several
tokens arrives in several pieces, and errors before the first token stay
ordinary errors (so the memory's recovery still works).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from integration_support import (  # app, client: fixtures
    app,
    async_client,
    client,
    sync_client,
)

from leyline_langchain import ChatLeyline
from leyline_sdk import LeylineMemory, Message
from leyline_sdk.errors import SessionNotFound, VersionConflict
from leyline_sdk.protocol import GenerateResponse

PROMPTS = ["Say hello.", "List three colours.", "Count from one to five.", "What is a cat?"]
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}


def split(events: list) -> tuple[list[str], GenerateResponse]:
    *deltas, last = events
    assert all(isinstance(d, str) and d for d in deltas), deltas
    assert isinstance(last, GenerateResponse)
    return deltas, last


def test_native_sse_events(app, client):
    """The wire: ``delta`` events, then one ``done`` event with the GenerateResponse."""
    client.create_session([{"role": "user", "content": "Say hello."}], session_id="sse-wire")
    _, http = sync_client(app)
    with http, http.stream("POST", "/sessions/sse-wire/generate",
                           json={"max_tokens": 6, "stream": True, "tools": []}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    events = [json.loads(line[5:]) for line in lines]
    assert [e["type"] for e in events[:-1]] == ["delta"] * (len(events) - 1)
    assert events[-1]["type"] == "done"
    done = GenerateResponse.model_validate(events[-1]["response"])
    assert "".join(e["content"] for e in events[:-1]) == done.message.content
    assert done.version == client.get_session("sse-wire").version


def test_deltas_add_up_to_the_stored_reply(client):
    pieces = []
    for i, prompt in enumerate(PROMPTS):
        sid = f"stream-{i}"
        client.create_session([{"role": "user", "content": prompt}], session_id=sid)
        deltas, done = split(list(client.generate_stream(sid, max_tokens=8, tools=[])))  # []: text only
        stored = client.get_session(sid, include_messages=True).messages[-1]
        assert "".join(deltas) == done.message.content == stored.content
        text_tokens = done.usage.completion_tokens - (done.finish_reason == "stop")
        if done.message.content.isascii():  # every token is whole text: one delta per token
            assert len(deltas) == text_tokens
        pieces.append(len(deltas))
    assert max(pieces) >= 3, pieces  # several prompts: some reply comes in several pieces


def test_stream_equals_non_stream_at_temperature_0(client):
    for sid in ("eq-a", "eq-b"):
        client.create_session([{"role": "user", "content": "List three colours."}], session_id=sid)
    plain = client.generate("eq-a", max_tokens=10, tools=[])
    deltas, streamed = split(list(client.generate_stream("eq-b", max_tokens=10, tools=[])))
    assert streamed.message.content == plain.message.content == "".join(deltas)
    assert streamed.usage.completion_tokens == plain.usage.completion_tokens


def test_stop_strings_are_never_streamed(client):
    client.create_session([{"role": "user", "content": "Count from one to five."}], session_id="stop-probe")
    probe = client.generate("stop-probe", max_tokens=10, tools=[]).message.content
    stop = probe[len(probe) // 2:len(probe) // 2 + 2] if len(probe) >= 4 else probe
    client.create_session([{"role": "user", "content": "Count from one to five."}], session_id="stop-s")
    deltas, done = split(list(client.generate_stream("stop-s", max_tokens=10, stop=[stop], tools=[])))
    assert stop not in "".join(deltas)
    assert "".join(deltas) == done.message.content


def test_tool_calls_come_with_the_last_event(client):
    client.create_session([{"role": "user", "content": "Weather in Paris?"}], session_id="stream-tools")
    events = list(client.generate_stream("stream-tools", max_tokens=40, temperature=1.0, seed=3,
                                         tools=[WEATHER], tool_choice="required"))
    deltas, done = split(events)
    assert deltas == [] and done.message.content == ""  # a required call: no text at all
    assert [c.function.name for c in done.message.tool_calls or []] == ["weather"]  # city <= 12 chars: fits


def test_errors_before_the_first_token_raise(client):
    with pytest.raises(SessionNotFound):
        list(client.generate_stream("no-such-session", max_tokens=4))
    client.create_session([{"role": "user", "content": "hi"}], session_id="stream-409")
    with pytest.raises(VersionConflict):
        list(client.generate_stream("stream-409", max_tokens=4, expected_version=7))


def test_async_client_streams(app):
    async def scenario():
        async with async_client(app) as aclient:
            await aclient.create_session([{"role": "user", "content": "Say hello."}], session_id="astream")
            events = [e async for e in aclient.generate_stream("astream", max_tokens=6)]
            deltas, done = split(events)
            assert "".join(deltas) == done.message.content
            with pytest.raises(SessionNotFound):
                _ = [e async for e in aclient.generate_stream("nope", max_tokens=4)]

    asyncio.run(scenario())


def test_memory_stream_rebuilds_a_lost_session(client):
    memory = LeylineMemory(client)
    view = [Message(role="user", content="Say hello.")]
    first = list(memory.generate_stream("t-stream", view, message_id="m1", max_tokens=6))
    assert first[-1].message.id == "m1" and memory.shadow("t-stream")[-1].id == "m1"
    client.delete_session(memory.session_id("t-stream"))  # the runtime loses it
    view = [*view, first[-1].message, Message(role="user", content="Again.")]
    deltas, done = split(list(memory.generate_stream("t-stream", view, max_tokens=6)))
    assert memory.last_call("t-stream").rebuilds == 1
    assert "".join(deltas) == done.message.content


def test_chat_leyline_streams_token_by_token(client):
    memory = LeylineMemory(client)
    model = ChatLeyline.from_memory(memory, max_tokens=12)
    for i, prompt in enumerate(PROMPTS):
        chunks = list(model.model_copy(update={"thread_id": f"lc-{i}"}).stream([HumanMessage(prompt)]))
        assert all(isinstance(c, AIMessageChunk) for c in chunks)
        full = chunks[0]
        for c in chunks[1:]:
            full = full + c
        last = chunks[-1]
        assert last.chunk_position == "last" and last.content == ""
        assert last.usage_metadata["output_tokens"] >= 1
        assert "cache_read" in last.usage_metadata["input_token_details"]
        assert last.response_metadata["model_name"] == "leyline-default"
        assert full.content == memory.shadow(f"lc-{i}")[-1].content
        assert len({c.id for c in chunks}) == 1 and chunks[0].id == memory.shadow(f"lc-{i}")[-1].id
        if len(chunks) >= 4:  # first, a middle, the last: streamed in pieces
            break
    else:
        pytest.fail("no reply came in more than one text chunk")


def test_chat_leyline_astream_and_tool_calls(app):
    async def scenario():
        async with async_client(app) as aclient:
            model = ChatLeyline.from_memory(LeylineMemory(aclient), max_tokens=40, temperature=1.0, seed=5)
            bound = model.bind_tools([WEATHER], tool_choice="any")
            full = None
            async for chunk in bound.astream("Weather in Paris?"):
                full = chunk if full is None else full + chunk
            assert full.usage_metadata["input_token_details"]["cache_read"] >= 0
            assert [c["name"] for c in full.tool_calls] == ["weather"]  # city <= 12 chars: fits
            assert isinstance(full.tool_calls[0]["args"]["city"], str)

    asyncio.run(scenario())
