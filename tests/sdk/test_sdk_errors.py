"""Status errors carry the answer (response, request, body), and every 409 is a ConflictError.

Against the real runtime in-process where it answers the case (a duplicate
session, a stale version); a MockTransport only for answers the runtime never
gives (a proxy's page, a code this SDK does not know).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.testclient import TestClient
from integration_support import app, async_client, client  # noqa: F401  (fixtures)

from leyline_runtime import create_app
from leyline_sdk import (
    APIStatusError,
    AsyncLeylineClient,
    ConflictError,
    LeylineClient,
    LeylineMemory,
    Message,
    SessionExists,
    Unauthorized,
    ValidationFailed,
    VersionConflict,
    error_for,
)

HELLO = [{"role": "user", "content": "hello"}]


def test_a_duplicate_session_is_a_409_conflict_carrying_the_answer(client):  # noqa: F811
    client.create_session(HELLO, session_id="dup")
    with pytest.raises(SessionExists) as caught:
        client.create_session(HELLO, session_id="dup")
    exc = caught.value
    assert isinstance(exc, ConflictError) and exc.status_code == 409 and exc.code == "session_exists"
    assert exc.response is not None and exc.response.status_code == 409
    assert exc.request is not None and (exc.request.method, exc.request.url.path) == ("POST", "/sessions")
    assert exc.body == {"error": {"code": "session_exists", "message": "session dup already exists"}}
    assert client.get_session("dup").num_messages == 1  # nothing changed


def test_a_duplicate_session_on_the_async_client(app):  # noqa: F811
    async def scenario() -> SessionExists:
        async with async_client(app) as aclient:
            await aclient.create_session(HELLO, session_id="dup-async")
            with pytest.raises(SessionExists) as caught:
                await aclient.create_session(HELLO, session_id="dup-async")
            return caught.value

    assert asyncio.run(scenario()).response.status_code == 409


def test_a_stale_version_is_a_conflict_too(client):  # noqa: F811
    info = client.create_session(HELLO, session_id="stale")
    with pytest.raises(ConflictError) as caught:
        client.append("stale", HELLO, expected_version=info.version + 1)
    assert type(caught.value) is VersionConflict
    assert caught.value.body["error"]["code"] == "version_conflict"


def answering(response: httpx.Response) -> LeylineClient:
    return LeylineClient("http://leyline.test", transport=httpx.MockTransport(lambda request: response))


@pytest.mark.parametrize(
    ("response", "cls", "code", "body"),
    [
        # a code this SDK does not know still says "conflict" through its status
        (httpx.Response(409, json={"error": {"code": "lease_held", "message": "m"}}), ConflictError, "lease_held",
         {"error": {"code": "lease_held", "message": "m"}}),
        # a proxy's page: no JSON, the status picks the class, the text is the body
        (httpx.Response(409, text="<h1>Conflict</h1>"), ConflictError, "conflict", "<h1>Conflict</h1>"),
        (httpx.Response(401, text="denied"), Unauthorized, "unauthorized", "denied"),
        (httpx.Response(422, json={"detail": [{"loc": ["body"]}]}), ValidationFailed, "validation_error",
         {"detail": [{"loc": ["body"]}]}),
        (httpx.Response(502, text="bad gateway"), APIStatusError, "http_error", "bad gateway"),
    ],
)
def test_answers_without_a_known_code_map_by_status(response, cls, code, body) -> None:
    with answering(response) as client, pytest.raises(APIStatusError) as caught:
        client.health()
    assert type(caught.value) is cls and caught.value.code == code and caught.value.body == body
    assert caught.value.response is not None and caught.value.request.url.path == "/healthz"


def test_an_error_raised_without_an_answer_carries_none() -> None:
    exc = error_for("session_exists", "made here", None)
    assert isinstance(exc, SessionExists) and exc.status_code is None
    assert (exc.response, exc.request, exc.body) == (None, None, None)
    # the runtime raises the class itself; its wire body is the code and message
    assert SessionExists("s exists").to_body() == {"error": {"code": "session_exists", "message": "s exists"}}
    assert SessionExists.status_code == 409


class FirstCreateRaced(LeylineClient):
    """Another process creates the session just before this client's first create reaches the runtime."""

    raced = False

    def create_session(self, messages=None, session_id=None):  # type: ignore[no-untyped-def]
        if not self.raced:
            self.raced = True
            super().create_session(messages, session_id=session_id)
        return super().create_session(messages, session_id=session_id)


def test_memory_adopts_a_session_created_meanwhile(app):  # noqa: F811
    with TestClient(app) as http:
        memory = LeylineMemory(FirstCreateRaced("http://testserver", http_client=http))
        view = [Message(role="user", content="hello", id="u1")]
        reply = memory.generate("raced-thread", view, max_tokens=2)
    assert reply.message.role == "assistant"
    assert memory.stats("raced-thread").resyncs == 1  # the 409 led to reading the session, not to an error


@pytest.fixture()
def keyed_app(app, monkeypatch):  # noqa: F811
    """The module's runtime behind a server started with one API key (``LEYLINE_API_KEYS``)."""
    monkeypatch.setenv("LEYLINE_API_KEYS", "sk-test")
    monkeypatch.delenv("LEYLINE_API_KEY", raising=False)  # the clients below send only what they are given
    return create_app(runtime=app.state.runtime)


def test_a_missing_or_wrong_key_tells_an_sdk_user_where_keys_are_set(keyed_app):
    with TestClient(keyed_app) as http:
        with pytest.raises(Unauthorized) as missing:
            LeylineClient("http://testserver", http_client=http).list_sessions()
        with pytest.raises(Unauthorized) as missing_streamed:
            list(LeylineClient("http://testserver", http_client=http).generate_stream("s"))
        with pytest.raises(Unauthorized) as wrong:
            LeylineClient("http://testserver", api_key="sk-wrong", http_client=http).list_sessions()
        assert LeylineClient("http://testserver", api_key="sk-test", http_client=http).list_sessions() == []
    for caught in (missing, missing_streamed):
        message = caught.value.message
        assert message.startswith("missing API key") and "set LEYLINE_API_KEY, or pass api_key=" in message, message
    # a key was sent but the server knows no such key: where each side's key is set
    assert wrong.value.message.startswith("invalid API key (") and "LEYLINE_API_KEY" in wrong.value.message
    assert "--api-key" in wrong.value.message and "LEYLINE_API_KEYS" in wrong.value.message, wrong.value.message
    assert wrong.value.body["error"]["message"] == "invalid API key"  # the server's own words, kept in the body
    assert missing.value.body["error"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"


def test_a_missing_key_on_the_async_client_says_the_same(keyed_app):
    async def scenario() -> Unauthorized:
        async with AsyncLeylineClient("http://testserver", transport=httpx.ASGITransport(app=keyed_app)) as aclient:
            with pytest.raises(Unauthorized) as caught:
                await aclient.list_sessions()
            return caught.value

    assert "set LEYLINE_API_KEY, or pass api_key=" in asyncio.run(scenario()).message
