"""Stream / AsyncStream: the objects ``generate_stream`` returns, against the real runtime.

They send when first iterated, carry the response once sent, release the
connection when closed (also half way), and an error event inside the stream
is raised carrying its ``error`` object (a MockTransport: the runtime writes
one only when a generation fails after its first token).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from integration_support import app, async_client, client  # noqa: F401  (fixtures)

from leyline_sdk import AsyncStream, GenerateResponse, LeylineClient, SessionNotFound, Stream

HELLO = [{"role": "user", "content": "Count from one to five."}]


def test_a_stream_sends_when_first_iterated(client):  # noqa: F811
    info = client.create_session(HELLO, session_id="lazy")
    stream = client.generate_stream("lazy", max_tokens=4)
    assert isinstance(stream, Stream) and stream.response is None
    stream.close()  # closed before the first event: nothing was sent
    assert client.get_session("lazy").version == info.version
    assert list(stream) == []


def test_a_stream_read_to_the_end(client):  # noqa: F811
    client.create_session(HELLO, session_id="whole")
    with client.generate_stream("whole", max_tokens=6) as stream:
        *deltas, done = list(stream)
    assert isinstance(done, GenerateResponse) and "".join(deltas) == done.message.content
    assert stream.response is not None and stream.response.is_closed
    assert stream.response.headers["content-type"].startswith("text/event-stream")


def test_closing_half_way_releases_the_connection(client):  # noqa: F811
    client.create_session(HELLO, session_id="half")
    with client.generate_stream("half", max_tokens=12, min_tokens=12, tools=[]) as stream:  # []: text only
        first = next(stream)
    assert isinstance(first, str) and stream.response is not None and stream.response.is_closed
    with pytest.raises(StopIteration):
        next(stream)
    # the session is usable at once: the stream's lock on it is gone
    assert client.generate("half", max_tokens=2).message.role == "assistant"


def test_an_error_answer_raises_from_the_loop(client):  # noqa: F811
    stream = client.generate_stream("nobody", max_tokens=2)
    with pytest.raises(SessionNotFound) as caught:
        next(stream)
    assert caught.value.response is stream.response and caught.value.status_code == 404


def test_async_stream(app):  # noqa: F811
    async def scenario() -> tuple[list, AsyncStream]:
        async with async_client(app) as aclient:
            await aclient.create_session(HELLO, session_id="async-stream")
            stream = aclient.generate_stream("async-stream", max_tokens=6)
            assert isinstance(stream, AsyncStream) and stream.response is None
            async with stream:
                return [event async for event in stream], stream

    events, stream = asyncio.run(scenario())
    assert isinstance(events[-1], GenerateResponse) and stream.response.is_closed


def test_an_error_event_in_the_stream_carries_its_body() -> None:
    error = {"code": "capacity_exceeded", "message": "the cache filled up"}
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in ({"type": "delta", "content": "Hel"},
                                                          {"type": "error", "error": error}))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=sse)

    with LeylineClient("http://leyline.test", transport=httpx.MockTransport(handler)) as mocked:
        stream = mocked.generate_stream("s1", max_tokens=4)
        assert next(stream) == "Hel"
        with pytest.raises(Exception) as caught:
            next(stream)
    exc = caught.value
    assert exc.code == "capacity_exceeded" and exc.status_code is None  # the status line said 200
    assert exc.body == error and exc.response is stream.response
