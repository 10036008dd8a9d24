"""LeylineMemory's two drivers make the same requests: the sync client, the async client, and the sync
client run in worker threads by the async methods. Against the real runtime in-process, every request
the flow can ask for (adopt, build, edit, append, generate, streamed generate, rebuild, delete),
recorded on the wire.

And what a memory names: a rerun of a thread is not a user correction, and an async-only memory asked
for a sync call says which client it needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
from starlette.testclient import TestClient
from integration_support import app, async_client, client  # noqa: F401  (fixtures)

from leyline_sdk import AsyncLeylineClient, LeylineClient, LeylineMemory, Message, ToolCall
from leyline_sdk.protocol import FunctionCall

GEN = {"max_tokens": 3, "temperature": 0.0}
Wire = list[tuple[str, str, str, str | None, bool]]  # method, path, query, X-Leyline-Rebuild, streamed


def agent_view() -> list[Message]:
    call = ToolCall(id="c1", function=FunctionCall(name="read_file", arguments='{"path": "notes.txt"}'))
    return [
        Message(role="system", content="You are a careful agent.", id="s"),
        Message(role="user", content="Sum the values in notes.txt.", id="u1"),
        Message(role="assistant", content="", id="a1", tool_calls=[call]),
        Message(role="tool", content="\n".join(f"line {i}: {i * 7}" for i in range(12)), id="t1",
                tool_call_id="c1", name="read_file"),
    ]


def cleared(shadow: list[Message], question: str) -> list[Message]:
    """The shadow with its tool result cleared and a new user question after it."""
    view = [m.model_copy(update={"content": "[cleared]"}) if m.role == "tool" else m for m in shadow]
    return [*view, Message(role="user", content=question, id=question)]


def recorder(wire: Wire, session_id: str) -> Callable[[httpx.Request], None]:
    def record(request: httpx.Request) -> None:
        body = json.loads(request.content) if request.content else {}
        wire.append((request.method, request.url.path.replace(session_id, "{id}"), request.url.query.decode(),
                     request.headers.get("x-leyline-rebuild"), bool(body.get("stream"))))
    return record


# What every driver sends for the scenario below, in order.
EXPECTED: Wire = [
    ("GET", "/sessions/{id}", "include_messages=true", None, False),  # adopt: 404, not there yet
    ("POST", "/sessions", "", None, False),  # build it from the view
    ("POST", "/sessions/{id}/generate", "", None, False),
    ("POST", "/directives", "", None, False),  # the cleared tool result
    ("POST", "/sessions/{id}/messages", "", None, False),  # the new question (sync appends the tail)
    ("POST", "/sessions/{id}/generate", "", None, True),  # 404: deleted behind the memory's back
    ("POST", "/sessions", "", "session_not_found", False),  # rebuilt, the reason named
    ("POST", "/sessions/{id}/generate", "", None, True),
    ("DELETE", "/sessions/{id}", "", None, False),  # reset
]


def sync_scenario(memory: LeylineMemory, thread: str, delete_behind: Callable[[str], None]) -> None:
    memory.generate(thread, agent_view(), message_id="r1", **GEN)
    memory.sync(thread, cleared(memory.shadow(thread), "and the total?"))
    delete_behind(memory.session_id(thread))
    view = [*memory.shadow(thread), Message(role="user", content="again", id="u3")]
    *deltas, done = memory.generate_stream(thread, view, message_id="r2", **GEN)
    assert "".join(deltas) == done.message.content
    memory.reset(thread)


async def async_scenario(memory: LeylineMemory, thread: str, delete_behind: Callable[[str], None]) -> None:
    await memory.agenerate(thread, agent_view(), message_id="r1", **GEN)
    await memory.async_sync(thread, cleared(memory.shadow(thread), "and the total?"))
    delete_behind(memory.session_id(thread))
    view = [*memory.shadow(thread), Message(role="user", content="again", id="u3")]
    *deltas, done = [e async for e in memory.agenerate_stream(thread, view, message_id="r2", **GEN)]
    assert "".join(deltas) == done.message.content
    await memory.areset(thread)


def test_the_sync_driver_makes_the_flows_requests(app, client):  # noqa: F811
    wire: Wire = []
    http = TestClient(app)
    http.event_hooks["request"] = [recorder(wire, "lg-sync")]
    with http:
        memory = LeylineMemory(LeylineClient("http://testserver", http_client=http))
        sync_scenario(memory, "sync", client.delete_session)
    assert wire == EXPECTED
    assert memory.calls("sync") == []  # reset forgot the thread


def test_the_async_driver_makes_the_same_requests(app, client):  # noqa: F811
    wire: Wire = []
    record = recorder(wire, "lg-async")

    async def hook(request: httpx.Request) -> None:
        record(request)

    async def scenario() -> None:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), event_hooks={"request": [hook]})
        async with AsyncLeylineClient("http://testserver", http_client=http) as aclient, http:
            await async_scenario(LeylineMemory(aclient), "async", client.delete_session)

    asyncio.run(scenario())
    assert wire == EXPECTED


def test_the_async_methods_drive_a_sync_client_in_worker_threads(app, client):  # noqa: F811
    wire: Wire = []
    http = TestClient(app)
    http.event_hooks["request"] = [recorder(wire, "lg-threaded")]
    with http:
        memory = LeylineMemory(LeylineClient("http://testserver", http_client=http))  # no async client
        asyncio.run(async_scenario(memory, "threaded", client.delete_session))
    assert wire == EXPECTED


def test_a_rerun_of_a_thread_is_named_a_rerun_not_a_user_correction(client):  # noqa: F811
    first = [Message(role="system", content="Answer briefly."), Message(role="user", content="What is 2+3?")]
    earlier_run = LeylineMemory(client)
    earlier_run.generate("rerun", first, **GEN)
    earlier_run.generate("rerun", [*earlier_run.shadow("rerun"), Message(role="user", content="And 4+4?")], **GEN)

    # The same script again (a new memory, the same thread): it adopts the session the earlier run
    # left and starts over from the first question, dropping that run's later turns.
    rerun = LeylineMemory(client)
    rerun.generate("rerun", first, **GEN)
    assert [(e.reason, e.applied_mode) for e in rerun.last_call("rerun").edits] == [("rerun", "forget")]

    # From then on the session is this memory's own: changing a user turn is a user correction.
    corrected = [first[0], Message(role="user", content="What is 2+4?")]
    rerun.generate("rerun", corrected, **GEN)
    assert [(e.reason, e.applied_mode) for e in rerun.last_call("rerun").edits] == [("user_correction", "forget")]


def test_an_async_only_memory_asked_for_a_sync_call_names_the_client_it_needs():
    memory = LeylineMemory(AsyncLeylineClient("http://127.0.0.1:9"))  # never reached
    with pytest.raises(TypeError, match=r"need LeylineMemory\(LeylineClient\(\)\).*ainvoke"):
        memory.generate("t", [Message(role="user", content="hi")])
    with pytest.raises(TypeError, match=r"LeylineClient"):
        list(memory.generate_stream("t", [Message(role="user", content="hi")]))
