"""LeylineClient / AsyncLeylineClient against httpx.MockTransport: request shapes, errors, retries.

Every behaviour test runs twice, once per client, through one view that runs
the async client's coroutines to completion, which is what "same surface" means.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import socket
import typing
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from leyline_sdk import (
    ERROR_CLASSES,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncLeylineClient,
    AsyncStream,
    CapacityExceeded,
    Directive,
    DirectiveResult,
    GenerateResponse,
    InvalidDirective,
    InvalidSpan,
    LeylineClient,
    LeylineError,
    Message,
    OverlappingSpans,
    SessionInfo,
    SessionNotFound,
    Span,
    Stream,
    Unauthorized,
    ValidationFailed,
    VersionConflict,
    error_for,
)
from leyline_sdk._config import DEFAULT_TIMEOUT
from leyline_sdk._response import NO_KEY_HINT
from leyline_sdk._retry import RetryPolicy

Handler = Callable[[httpx.Request], httpx.Response]

SESSION = {
    "session_id": "s1",
    "version": 3,
    "num_tokens": 12,
    "num_messages": 1,
    "segments": [{"index": 0, "message_id": None, "role": "user", "start": 0, "end": 12}],
    "counters": {"prefilled_tokens": 12},
}
USAGE = {"prompt_tokens": 12, "cached_tokens": 0, "prefill_tokens": 12}
APPENDED = {"session_id": "s1", "version": 4, "num_tokens": 20, "num_messages": 2, "usage": USAGE}
GENERATED = {
    "session_id": "s1",
    "message": {"role": "assistant", "content": "hi"},
    "finish_reason": "stop",
    "usage": USAGE,
    "version": 5,
}
APPLIED = {
    "session_id": "s1",
    "version": 6,
    "num_tokens": 9,
    "num_messages": 1,
    "outcomes": [
        {
            "requested_mode": "amortize",
            "applied_mode": "amortize",
            "token_start": 0,
            "token_end": 3,
            "delta": -3,
        }
    ],
    "elapsed_ms": 1.5,
}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
}


class Recorder:
    """A MockTransport handler that answers from a queue and remembers each request."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(answer, Exception):
            raise answer
        # a fresh response each time: one queued answer may serve several requests
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.read())

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def body(self) -> Any:
        return json.loads(self.last.content)


def ok(payload: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=payload)


def error(status: int, code: str, message: str = "nope") -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


class Blocking:
    """The async client seen through sync calls: each coroutine runs to completion."""

    def __init__(self, client: Any, runner: asyncio.Runner | None) -> None:
        self._client, self._runner = client, runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if inspect.isawaitable(result):
                assert self._runner is not None
                return self._runner.run(result)  # type: ignore[arg-type]
            return result

        return call


@pytest.fixture(params=["sync", "async"])
def make_client(request: pytest.FixtureRequest) -> Iterator[Callable[..., Blocking]]:
    runner = asyncio.Runner() if request.param == "async" else None
    cls = AsyncLeylineClient if runner else LeylineClient

    def make(handler: Handler, **kwargs: Any) -> Blocking:
        kwargs.setdefault("base_url", "http://leyline.test")
        return Blocking(cls(transport=httpx.MockTransport(handler), **kwargs), runner)

    yield make
    if runner is not None:
        runner.close()


@pytest.fixture(autouse=True)
def _no_env_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEYLINE_BASE_URL", raising=False)
    monkeypatch.delenv("LEYLINE_API_KEY", raising=False)
    monkeypatch.setattr(RetryPolicy, "initial_delay", 0.0)


# --- request shapes --------------------------------------------------------------------------


def test_create_session(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(SESSION, 201))
    client = make_client(rec)
    info = client.create_session([Message(role="user", content="hi")], session_id="s1")
    assert isinstance(info, SessionInfo) and info.version == 3
    assert (rec.last.method, rec.last.url.path) == ("POST", "/sessions")
    assert rec.body() == {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]}


def test_create_session_without_arguments(make_client: Callable[..., Blocking]) -> None:
    """The client names the session (the runtimes' format), so a router can pin its replica."""
    rec = Recorder(ok(SESSION, 201))
    make_client(rec).create_session()
    body = rec.body()
    assert body["messages"] == [] and re.fullmatch(r"sess_[0-9a-f]{16}", body["session_id"])
    assert rec.last.headers["X-Leyline-Session"] == body["session_id"]


def test_every_session_call_carries_the_session_header(make_client: Callable[..., Blocking]) -> None:
    """What a session-affinity router hashes on (docs/vllm.md, Replicas), without the caller wiring it."""
    rec = Recorder(ok(SESSION))
    client = make_client(rec)
    seen: dict[str, str | None] = {}

    def sent(name: str, response: httpx.Response, call: Callable[[], Any]) -> None:
        rec.responses = [response]
        call()
        seen[name] = rec.last.headers.get("X-Leyline-Session")

    user = [Message(role="user", content="hi")]
    sent("create", ok(SESSION, 201), lambda: client.create_session(user, session_id="s1"))
    sent("get", ok(SESSION), lambda: client.get_session("s1"))
    sent("delete", httpx.Response(204), lambda: client.delete_session("s1"))
    sent("append", ok(APPENDED), lambda: client.append("s1", user))
    sent("generate", ok(GENERATED), lambda: client.generate("s1", user))
    sent("apply", ok(APPLIED), lambda: client.apply("s1", [Directive(span=Span(start=0, end=1))]))
    sent("bound chat", ok({"choices": []}), lambda: client.chat(user, session_id="s1"))
    assert seen == dict.fromkeys(seen, "s1") and len(seen) == 7
    sent("unbound chat", ok({"choices": []}), lambda: client.chat(user))
    sent("list", ok({"sessions": []}), lambda: client.list_sessions())
    assert seen["unbound chat"] is None and seen["list"] is None  # round-robin behind the router
    rec.responses = [ok(SESSION, 201)]
    client.create_session(user, session_id="s1", rebuild_reason="session_not_found")
    assert rec.last.headers["X-Leyline-Rebuild"] == "session_not_found"


def test_get_list_delete(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(SESSION))
    client = make_client(rec)
    client.get_session("s1")
    assert (rec.last.method, rec.last.url.path, rec.last.url.query) == ("GET", "/sessions/s1", b"")
    client.get_session("s1", include_messages=True)
    assert rec.last.url.params["include_messages"] == "true"

    rec.responses = [ok({"sessions": [SESSION, {**SESSION, "session_id": "s2"}]})]
    assert [s.session_id for s in client.list_sessions()] == ["s1", "s2"]
    assert (rec.last.method, rec.last.url.path) == ("GET", "/sessions")

    rec.responses = [httpx.Response(204)]
    assert client.delete_session("s1") is None
    assert (rec.last.method, rec.last.url.path) == ("DELETE", "/sessions/s1")


def test_session_ids_are_escaped_in_paths(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(SESSION))
    make_client(rec).get_session("a/b c")
    assert rec.last.url.raw_path == b"/sessions/a%2Fb%20c"


def test_append(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(APPENDED))
    result = make_client(rec).append(
        "s1", [{"role": "user", "content": "more"}], expected_version=3
    )
    assert result.version == 4 and result.usage.prefill_tokens == 12
    assert (rec.last.method, rec.last.url.path) == ("POST", "/sessions/s1/messages")
    assert rec.body() == {"messages": [{"role": "user", "content": "more"}], "expected_version": 3}


def test_generate_sends_only_chosen_sampling(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(GENERATED))
    reply = make_client(rec).generate(
        "s1", [Message(role="user", content="q")], max_tokens=8, temperature=0.5
    )
    assert isinstance(reply, GenerateResponse) and reply.message.content == "hi"
    assert (rec.last.method, rec.last.url.path) == ("POST", "/sessions/s1/generate")
    assert rec.body() == {
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 8,
        "temperature": 0.5,
    }


def test_generate_rejects_bad_arguments_before_sending(
    make_client: Callable[..., Blocking],
) -> None:
    rec = Recorder(ok(GENERATED))
    client = make_client(rec)
    with pytest.raises(TypeError, match="max_token"):
        client.generate("s1", max_token=8)
    with pytest.raises(ValidationFailed) as caught:
        client.generate("s1", temperature=5.0)
    assert caught.value.status_code is None and caught.value.code == "validation_error"
    assert rec.requests == []


def test_apply(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(APPLIED))
    directives = [
        Directive(
            span=Span(start=1, end=2),
            replacement=[Message(role="tool", content="[cleared]", tool_call_id="c1")],
        ),
        {"span": {"start": 0, "end": 3, "unit": "token"}, "replacement": "", "mode": "forget"},
    ]
    result = make_client(rec).apply("s1", directives, expected_version=5)
    assert isinstance(result, DirectiveResult) and result.outcomes[0].delta == -3
    assert (rec.last.method, rec.last.url.path) == ("POST", "/directives")
    assert rec.body() == {
        "session_id": "s1",
        "expected_version": 5,
        "directives": [
            {
                "span": {"start": 1, "end": 2, "unit": "message"},
                "replacement": [{"role": "tool", "content": "[cleared]", "tool_call_id": "c1"}],
                "mode": "amortize",
                "intent": "shrink",
            },
            {"span": {"start": 0, "end": 3, "unit": "token"}, "replacement": "", "mode": "forget", "intent": "shrink"},
        ],
    }


def test_apply_needs_a_directive(make_client: Callable[..., Blocking]) -> None:
    with pytest.raises(ValidationFailed):
        make_client(Recorder(ok(APPLIED))).apply("s1", [])


def test_chat(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(COMPLETION))
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "be brief"},
        Message(role="user", content="hi", id="u1"),
    ]
    answer = make_client(rec).chat(
        messages, session_id="s1", mode="forget", tools=tools, max_tokens=4
    )
    assert answer == COMPLETION
    assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/chat/completions")
    assert rec.body() == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi", "id": "u1"},
        ],
        "session_id": "s1",
        "leyline": {"mode": "forget"},
        "tools": tools,
        "max_tokens": 4,
    }


def test_chat_minimal_and_model(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok(COMPLETION))
    client = make_client(rec)
    client.chat([{"role": "user", "content": "hi"}])
    assert rec.body() == {"messages": [{"role": "user", "content": "hi"}]}
    client.chat([{"role": "user", "content": "hi"}], model="leyline-tiny")
    assert rec.body()["model"] == "leyline-tiny"
    with pytest.raises(TypeError):
        client.chat([{"role": "user", "content": "hi"}], stream=True)


def test_health(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok({"status": "ok"}))
    assert make_client(rec).health() == {"status": "ok"}
    assert (rec.last.method, rec.last.url.path) == ("GET", "/healthz")


# --- settings ----------------------------------------------------------------------------------


def test_auth_header_and_user_agent(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok({"status": "ok"}))
    make_client(rec, api_key="sk-test").health()
    assert rec.last.headers["authorization"] == "Bearer sk-test"
    assert rec.last.headers["user-agent"].startswith("leyline-sdk/")
    make_client(rec).health()
    assert "authorization" not in rec.last.headers


def test_extra_headers(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok({"status": "ok"}))
    make_client(rec, headers={"X-Leyline-Session": "s1"}).health()
    assert rec.last.headers["x-leyline-session"] == "s1"


def test_environment(make_client: Callable[..., Blocking], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEYLINE_BASE_URL", "http://env-host:9000/prefix/")
    monkeypatch.setenv("LEYLINE_API_KEY", "sk-env")
    rec = Recorder(ok({"status": "ok"}))
    client = make_client(rec, base_url=None)
    client.health()
    assert str(rec.last.url) == "http://env-host:9000/prefix/healthz"
    assert rec.last.headers["authorization"] == "Bearer sk-env"
    assert client.base_url == "http://env-host:9000/prefix" and client.api_key == "sk-env"


def test_arguments_beat_environment(
    make_client: Callable[..., Blocking], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEYLINE_BASE_URL", "http://env-host:9000")
    monkeypatch.setenv("LEYLINE_API_KEY", "sk-env")
    rec = Recorder(ok({"status": "ok"}))
    make_client(rec, base_url="http://arg-host", api_key="sk-arg").health()
    assert rec.last.url.host == "arg-host" and rec.last.headers["authorization"] == "Bearer sk-arg"


def test_defaults(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(ok({"status": "ok"}))
    client = make_client(rec, base_url=None)
    client.health()
    assert str(rec.last.url) == "http://127.0.0.1:8000/healthz"
    assert client.max_retries == 2 and client.timeout == DEFAULT_TIMEOUT
    assert make_client(rec, timeout=3.0).timeout == httpx.Timeout(3.0)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (401, "unauthorized", Unauthorized),
        (404, "session_not_found", SessionNotFound),
        (409, "version_conflict", VersionConflict),
        (413, "capacity_exceeded", CapacityExceeded),
        (422, "invalid_span", InvalidSpan),
        (422, "overlapping_spans", OverlappingSpans),
        (422, "invalid_directive", InvalidDirective),
        (422, "validation_error", ValidationFailed),
        (500, "internal_error", APIStatusError),
        (503, "overloaded", APIStatusError),
    ],
)
def test_error_codes_map_to_classes(
    make_client: Callable[..., Blocking], status: int, code: str, cls: type[LeylineError]
) -> None:
    rec = Recorder(error(status, code, "what went wrong"))
    with pytest.raises(cls) as caught:
        make_client(rec).get_session("s1")
    assert type(caught.value) is cls
    # a 401 to a client that sent no key also says where the SDK reads one (test_sdk_errors.py)
    message = f"what went wrong ({NO_KEY_HINT})" if status == 401 else "what went wrong"
    assert (caught.value.code, caught.value.message, caught.value.status_code) == (code, message, status)
    assert len(rec.requests) == 1  # an HTTP status is never retried


def test_error_bodies_without_our_shape(make_client: Callable[..., Blocking]) -> None:
    client = make_client(Recorder(httpx.Response(502, text="Bad Gateway")))
    with pytest.raises(APIStatusError) as caught:
        client.health()
    assert (caught.value.status_code, caught.value.code, caught.value.message) == (
        502,
        "http_error",
        "Bad Gateway",
    )

    client = make_client(Recorder(ok({"detail": [{"msg": "field required"}]}, 422)))
    with pytest.raises(ValidationFailed, match="field required") as caught_validation:
        client.health()
    assert caught_validation.value.status_code == 422

    client = make_client(Recorder(ok({"detail": "Not Found"}, 404)))
    with pytest.raises(APIStatusError, match="Not Found"):
        client.health()

    with pytest.raises(Unauthorized):
        make_client(Recorder(httpx.Response(401))).health()


def test_unexpected_success_body(make_client: Callable[..., Blocking]) -> None:
    with pytest.raises(APIStatusError) as caught:
        make_client(Recorder(ok({"not": "a session"}))).get_session("s1")
    assert caught.value.code == "invalid_response" and caught.value.status_code == 200
    with pytest.raises(APIStatusError):
        make_client(Recorder(httpx.Response(200, text="<html>"))).health()


def test_error_classes() -> None:
    assert issubclass(InvalidSpan, InvalidDirective) and issubclass(
        OverlappingSpans, InvalidDirective
    )
    assert issubclass(APITimeoutError, APIConnectionError)
    plain = SessionNotFound("no session s9")
    assert (plain.code, plain.status_code, plain.message, str(plain)) == (
        "session_not_found",
        404,
        "no session s9",
        "no session s9",
    )
    assert plain.to_body() == {"error": {"code": "session_not_found", "message": "no session s9"}}
    assert ERROR_CLASSES["version_conflict"] is VersionConflict
    unknown = error_for("teapot", "short and stout", 418)
    assert type(unknown) is APIStatusError and (unknown.code, unknown.status_code) == (
        "teapot",
        418,
    )
    client_side = error_for("validation_error", "bad", None)
    assert type(client_side) is ValidationFailed and client_side.status_code is None


# --- retries -----------------------------------------------------------------------------------------


def test_connect_errors_are_retried(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(
        httpx.ConnectError("refused"), httpx.ConnectTimeout("slow"), ok({"status": "ok"})
    )
    assert make_client(rec).health() == {"status": "ok"}
    assert len(rec.requests) == 3


def test_retries_run_out(make_client: Callable[..., Blocking]) -> None:
    rec = Recorder(httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError) as caught:
        make_client(rec, max_retries=2).append("s1", [{"role": "user", "content": "x"}])
    assert len(rec.requests) == 3
    assert caught.value.status_code is None and caught.value.code == "connection_error"
    assert isinstance(caught.value.__cause__, httpx.ConnectError)

    rec = Recorder(httpx.ConnectTimeout("slow"))
    with pytest.raises(APITimeoutError):
        make_client(rec, max_retries=0).health()
    assert len(rec.requests) == 1


@pytest.mark.parametrize(
    "failure",
    [httpx.ReadTimeout("slow"), httpx.ReadError("reset"), httpx.RemoteProtocolError("eof")],
)
def test_failures_after_sending_are_not_retried(
    make_client: Callable[..., Blocking], failure: Exception
) -> None:
    # The server may have applied the batch already; sending it again could apply it twice.
    rec = Recorder(failure)
    directive = Directive(span=Span(start=0, end=1))
    with pytest.raises(APIConnectionError) as caught:
        make_client(rec).apply("s1", [directive])
    assert len(rec.requests) == 1
    assert isinstance(caught.value, APITimeoutError) == isinstance(failure, httpx.TimeoutException)


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
def test_http_statuses_are_not_retried(make_client: Callable[..., Blocking], status: int) -> None:
    rec = Recorder(error(status, "whatever"), ok({"status": "ok"}))
    with pytest.raises(LeylineError):
        make_client(rec).health()
    assert len(rec.requests) == 1


def test_retry_delays_grow_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RetryPolicy, "initial_delay", 0.25)
    policy = RetryPolicy(max_retries=10, base_url="http://h:1")
    delays = [policy.delay_or_raise(httpx.ConnectError("x"), attempt) for attempt in range(8)]
    assert all(0 < d <= RetryPolicy.max_delay for d in delays)
    assert delays[0] < delays[3]


def test_connection_error_names_the_url_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setenv("LEYLINE_BASE_URL", url)
        with LeylineClient(max_retries=0) as client, pytest.raises(APIConnectionError) as caught:
            client.health()
    message = str(caught.value)
    assert f"{url}/healthz" in message and "LEYLINE_BASE_URL" in message
    assert caught.value.status_code is None


@pytest.mark.parametrize("given", ["http://h:1/v1", "http://h:1/v1/", "http://h:1/", "http://h:1"])
def test_an_openai_style_base_url_is_accepted(given: str) -> None:
    rec = Recorder(ok({"status": "ok"}), ok({"id": "x"}))
    client = LeylineClient(base_url=given, transport=httpx.MockTransport(rec))
    assert client.base_url == "http://h:1"
    client.health()
    client.chat([{"role": "user", "content": "hi"}])
    assert [str(r.url) for r in rec.requests] == ["http://h:1/healthz", "http://h:1/v1/chat/completions"]


# --- lifecycle and parity -------------------------------------------------------------------------------


def test_sync_context_manager_closes_only_its_own_client() -> None:
    with LeylineClient(transport=httpx.MockTransport(Recorder(ok({})))) as client:
        client.health()
    assert client._http.is_closed

    shared = httpx.Client(transport=httpx.MockTransport(Recorder(ok({}))))
    with LeylineClient(http_client=shared) as client:
        client.health()
    assert not shared.is_closed
    shared.close()


def test_async_context_manager_closes_only_its_own_client() -> None:
    async def scenario() -> None:
        async with AsyncLeylineClient(transport=httpx.MockTransport(Recorder(ok({})))) as client:
            await client.health()
        assert client._http.is_closed

        shared = httpx.AsyncClient(transport=httpx.MockTransport(Recorder(ok({}))))
        async with AsyncLeylineClient(http_client=shared, base_url="http://x") as client:
            await client.health()
        assert not shared.is_closed
        await shared.aclose()

    asyncio.run(scenario())


def test_http_client_timeout_is_kept() -> None:
    shared = httpx.Client(timeout=7.0)
    assert LeylineClient(http_client=shared).timeout == httpx.Timeout(7.0)
    with pytest.raises(TypeError):
        LeylineClient(http_client=shared, transport=httpx.MockTransport(Recorder(ok({}))))
    shared.close()


def test_sync_and_async_have_the_same_surface() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, callable)
            if not name.startswith("_") and name != "aclose"
        }

    sync, async_ = public(LeylineClient), public(AsyncLeylineClient)
    assert sync.keys() == async_.keys()
    for name, signature in sync.items():
        assert [p.name for p in signature.parameters.values()] == [
            p.name for p in async_[name].parameters.values()
        ], name
        method = getattr(AsyncLeylineClient, name)
        # A stream is returned at once (it sends when first iterated), as openai-python's is.
        streams = typing.get_type_hints(method).get("return") is AsyncStream
        assert inspect.iscoroutinefunction(method) or streams, name
        assert streams == (typing.get_type_hints(getattr(LeylineClient, name)).get("return") is Stream), name
    assert {
        "create_session",
        "get_session",
        "list_sessions",
        "delete_session",
        "append",
        "generate",
        "apply",
        "chat",
        "health",
        "close",
    } <= sync.keys()
