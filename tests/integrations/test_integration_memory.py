"""LeylineMemory against the real app: shadow, directives, counters, recovery."""

from __future__ import annotations

import asyncio

import httpx
from fastapi.testclient import TestClient

from integration_support import (  # app, client: fixtures
    app,
    assert_same,
    async_client,
    client,
    new_app,
    sync_client,
)

from leyline_sdk import FunctionCall, LeylineClient, LeylineMemory, Message, ToolCall, force_mode

GEN = {"max_tokens": 3, "temperature": 0.0}


def call(cid: str, name: str, args: str) -> ToolCall:
    return ToolCall(id=cid, function=FunctionCall(name=name, arguments=args))


def agent_view(listing_lines: int = 30) -> list[Message]:
    listing = "\n".join(f"line {i}: value_{i * 7} = {i * i}" for i in range(listing_lines))
    return [
        Message(role="system", content="You are a careful agent.", id="s"),
        Message(role="user", content="Sum the values in notes.txt, then add 17.", id="u1"),
        Message(role="assistant", content="", id="a1", tool_calls=[call("c1", "read_file", '{"path": "notes.txt"}')]),
        Message(role="tool", content=listing, id="t1", tool_call_id="c1", name="read_file"),
        Message(role="assistant", content="", id="a2", tool_calls=[call("c2", "calculator", '{"expression": "1+2"}')]),
        Message(role="tool", content="3", id="t2", tool_call_id="c2", name="calculator"),
    ]


def session_messages(client, memory, thread) -> list[Message]:
    return client.get_session(memory.session_id(thread), include_messages=True).messages


def test_generate_builds_then_sends_only_edits_and_new_messages(client):
    memory = LeylineMemory(client)
    view = agent_view()
    memory.generate("m1", view, message_id="r1", **GEN)
    first = memory.last_call("m1")
    assert first.built and first.prefilled_tokens == first.prompt_tokens and first.prefix_cache_tokens == 0
    shadow = memory.shadow("m1")
    assert shadow[-1].id == "r1" and shadow[-1].role == "assistant"
    assert_same(session_messages(client, memory, "m1"), shadow)

    # append only: no directive, the tail rides with the generate
    view2 = [*shadow, Message(role="user", content="go on", id="u2")]
    memory.generate("m1", view2, message_id="r2", **GEN)
    second = memory.last_call("m1")
    assert second.directives == 0 and not second.built
    # everything the session held is reused (its reply re-encoded with an end marker when cut short)
    assert second.prefix_cache_tokens == second.reused_tokens
    assert 0 <= second.reused_tokens - (first.prompt_tokens + first.completion_tokens) <= 1
    assert second.prefilled_tokens < 10

    # truncate the long tool output in the middle: one amortized directive, the rest rotated
    shadow = memory.shadow("m1")
    truncated = shadow[3].model_copy(update={"content": "\n".join(shadow[3].content.splitlines()[:3])})
    view3 = [*shadow[:3], truncated, *shadow[4:], Message(role="user", content="and now?", id="u3")]
    memory.generate("m1", view3, message_id="r3", **GEN)
    third = memory.last_call("m1")
    assert third.directives == 1 and third.edits[0].applied_mode == "amortize"
    assert third.edits[0].reason == "tool_output_edit" and third.edits[0].delta < 0
    assert third.rotated_tokens > 0 and third.recomputed_tokens <= 2
    assert third.reused_tokens + third.rotated_tokens + third.recomputed_tokens + third.prefilled_tokens \
        == third.prompt_tokens
    assert third.prefix_cache_tokens == third.edits[0].token_start
    assert_same(session_messages(client, memory, "m1"), memory.shadow("m1"))
    totals = memory.stats("m1")
    assert totals.model_calls == 3 and totals.directives == 1
    assert totals.leyline_reused_tokens > totals.prefix_cache_tokens


def test_id_only_changes_are_not_sent_and_units_go_whole(client):
    memory = LeylineMemory(client)
    view = agent_view(5)
    memory.sync("m2", view)
    version = client.get_session(memory.session_id("m2")).version
    renamed = [m.model_copy(update={"id": f"{m.id}-new"}) for m in view]
    assert memory.sync("m2", renamed) == ([], [])
    assert client.get_session(memory.session_id("m2")).version == version
    assert [m.id for m in memory.shadow("m2")] == [m.id for m in renamed]
    # dropping a failed attempt (call + result) is one amortized deletion
    directives, tail = memory.sync("m2", renamed[:2] + renamed[4:])
    assert tail == [] and len(directives) == 1 and directives[0].mode == "amortize"
    assert (directives[0].span.start, directives[0].span.end) == (2, 4)
    # ids do not render; the runtime keeps the old ones (nothing was sent for them)
    assert_same(session_messages(client, memory, "m2"), renamed[:2] + renamed[4:], ids=False)


def test_recovers_from_lost_session_conflict_and_new_process(client, app):
    memory = LeylineMemory(client, policy=force_mode("amortize"))
    view = agent_view(5)
    memory.generate("m3", view, message_id="r1", **GEN)
    sid = memory.session_id("m3")

    # the runtime lost the session (restart, eviction): rebuilt from the full view, no error
    client.delete_session(sid)
    view = [*memory.shadow("m3"), Message(role="user", content="again", id="u2")]
    memory.generate("m3", view, message_id="r2", **GEN)
    call = memory.last_call("m3")
    assert call.built and call.rebuilds == 1 and call.prefix_cache_tokens == 0
    assert call.rebuild_reasons == ["session_not_found"]  # named, and sent as X-Leyline-Rebuild
    assert memory.stats("m3").rebuild_reasons == {"session_not_found": 1}
    assert_same(session_messages(client, memory, "m3"), memory.shadow("m3"))

    # someone else changed the session: version conflict -> re-read, re-diff
    client.append(sid, [Message(role="user", content="sneaked in", id="x")])
    view = [*memory.shadow("m3"), Message(role="user", content="third", id="u3")]
    memory.generate("m3", view, message_id="r3", **GEN)
    call = memory.last_call("m3")
    assert call.resyncs == 1 and not call.built and call.directives == 1  # the stray message deleted
    assert_same(session_messages(client, memory, "m3"), memory.shadow("m3"))

    # a new process (fresh memory) adopts the warm session instead of rebuilding it
    fresh = LeylineMemory(client)
    view = [*memory.shadow("m3"), Message(role="user", content="fourth", id="u4")]
    fresh.generate("m3", view, **GEN)
    call = fresh.last_call("m3")
    assert call.resyncs == 1 and not call.built and call.directives == 0 and call.prefilled_tokens < 10

    # a restarted runtime (a new app, nothing in it): rebuilt, no error
    other, http = sync_client(new_app())
    with http:
        fresh.client = other
        fresh.generate("m3", [*fresh.shadow("m3"), Message(role="user", content="5", id="u5")], **GEN)
        assert fresh.last_call("m3").built
        assert_same(other.get_session(sid, include_messages=True).messages, fresh.shadow("m3"))


def test_async_memory_over_asgi_transport(app):
    async def scenario():
        async with async_client(app) as aclient:
            memory = LeylineMemory(aclient)
            view = agent_view(8)
            await memory.agenerate("m4", view, message_id="r1", **GEN)
            edited = [*memory.shadow("m4")]
            edited[3] = edited[3].model_copy(update={"content": "[cleared]"})
            await memory.agenerate("m4", [*edited, Message(role="user", content="ok", id="u2")], **GEN)
            call = memory.last_call("m4")
            assert call.directives == 1 and call.rotated_tokens > 0
            info = await aclient.get_session(memory.session_id("m4"), include_messages=True)
            assert_same(info.messages, memory.shadow("m4"))
            await memory.areset("m4")
            assert memory.shadow("m4") is None

    asyncio.run(scenario())


def test_async_paths_fall_back_to_the_sync_client(client):
    memory = LeylineMemory(client)  # no async client: the async methods run it in a worker thread
    view = agent_view(4)
    asyncio.run(memory.agenerate("m5", view, message_id="r1", **GEN))
    directives, tail = asyncio.run(memory.async_sync("m5", [*memory.shadow("m5")[:2], *memory.shadow("m5")[4:]]))
    assert len(directives) == 1 and tail == []
    assert_same(session_messages(client, memory, "m5"), memory.shadow("m5"))


class LostAnswers(httpx.BaseTransport):
    """A router in front of the runtime that loses the answers of the paths in ``lose`` once each
    (502 Bad Gateway, nginx's answer when its replica dies under a request): the runtime ran them."""

    def __init__(self, http: TestClient, lose: set[str]):
        self.http, self.lose, self.lost = http, set(lose), []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        forwarded = self.http.send(self.http.build_request(
            request.method, str(request.url), content=request.read(), headers=request.headers))
        kind = request.url.path.rsplit("/", 1)[-1]
        if kind in self.lose:
            self.lose.discard(kind)
            self.lost.append(kind)
            return httpx.Response(502, text="<html><center>502 Bad Gateway</center></html>")
        return httpx.Response(forwarded.status_code, headers=forwarded.headers, content=forwarded.content)


def test_an_answer_lost_at_the_router_is_resynced_not_raised(app):
    """The runtime created the session and generated, but both answers were lost: the memory re-reads
    the session, takes back the reply the caller never saw, and generates again; no error."""
    with TestClient(app) as http:
        gateway = LostAnswers(http, {"sessions", "generate"})
        client = LeylineClient("http://testserver", transport=gateway)
        memory = LeylineMemory(client)
        reply = memory.generate("gw", agent_view(5), message_id="r1", **GEN)
        assert gateway.lost == ["sessions", "generate"] and reply.message.role == "assistant"
        call = memory.last_call("gw")
        assert call.resyncs >= 1 and call.directives == 1  # the unseen reply deleted, then generated anew
        assert_same(session_messages(client, memory, "gw"), memory.shadow("gw"))
