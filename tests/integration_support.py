"""Shared helpers for the LangGraph / LangChain integration tests (no tests here).

The runtime is the real one (default model, small cache), reached in-process:
``starlette.testclient.TestClient`` (an ``httpx.Client`` over the ASGI app) for
the sync client, ``httpx.ASGITransport`` for the async one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from starlette.testclient import TestClient
from server_support import make_runtime, torch_threads

from leyline_langchain.convert import to_leyline_messages
from leyline_langchain.pairing import repair_orphans
from leyline_runtime.text import chat_template as tpl
from leyline_runtime import create_app
from leyline_sdk import TOOLS_MESSAGE_ID, AsyncLeylineClient, LeylineClient, Message


def new_app():
    return create_app(runtime=make_runtime())


def sync_client(app) -> tuple[LeylineClient, TestClient]:
    http = TestClient(app)
    return LeylineClient("http://testserver", http_client=http), http


def async_client(app) -> AsyncLeylineClient:
    return AsyncLeylineClient("http://testserver", transport=httpx.ASGITransport(app=app))


# The in-process runtime app (one torch thread) that each integration module shares, and a
# sync client over it; modules import both fixtures by name.
@pytest.fixture(scope="module")
def app():
    with torch_threads(1):
        yield new_app()


@pytest.fixture()
def client(app):
    c, http = sync_client(app)
    with http:
        yield c


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    allowed = set("0123456789+-*/(). ")
    if not set(expression) <= allowed:
        return "Error: bad expression"
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only


@tool
def lookup(key: str) -> str:
    """Look a key up in the settings store."""
    store = {"api_port": "8080", "listing": "\n".join(f"row {i}: value {i * 7}" for i in range(30))}
    if key not in store:
        return f"Error: KeyError {key!r}; known keys: {sorted(store)}"
    return store[key]


class ScriptedToolCalls(AgentMiddleware):
    """The untrained default model writes no tool calls: substitute the next planned call."""

    def __init__(self, plan: Sequence[tuple[str, dict[str, Any]]]) -> None:
        super().__init__()
        self.plan = list(plan)
        self.step = 0

    def _swap(self, response: Any) -> Any:
        reply = response.result[0]
        if reply.tool_calls or self.step >= len(self.plan):
            return response
        name, args = self.plan[self.step]
        self.step += 1
        response.result[0] = AIMessage(content="", id=reply.id, tool_calls=[
            {"name": name, "args": args, "id": f"call_s{self.step}", "type": "tool_call"}])
        return response

    def wrap_model_call(self, request, handler):
        return self._swap(handler(request))

    async def awrap_model_call(self, request, handler):
        return self._swap(await handler(request))


def expected_view(messages: Sequence[BaseMessage], tools: Sequence[dict] | None) -> list[Message]:
    """What the session should hold before the reply: tools message (rendered by the
    runtime's own renderer) + the repaired, converted messages the model got."""
    head = [Message(role="system", content=tpl.render_tools(list(tools)), id=TOOLS_MESSAGE_ID)] if tools else []
    return head + to_leyline_messages(repair_orphans(list(messages)))


def assert_same(session: Sequence[Message], view: Sequence[Message], ids: bool = True) -> None:
    assert len(session) == len(view), (len(session), len(view))
    for i, (got, want) in enumerate(zip(session, view)):
        assert got.fingerprint() == want.fingerprint(), (i, got, want)
        if ids and got.id is not None:  # generated messages carry no id in the runtime
            assert got.id == want.id, (i, got.id, want.id)


def check_reply(session: Sequence[Message], reply: AIMessage) -> None:
    last = session[-1]
    assert last.role == "assistant" and last.content == reply.content
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in last.tool_calls or []] == [
        (c["id"], c["name"], c["args"]) for c in reply.tool_calls]


class SessionChecker(BaseCallbackHandler):
    """After every model call: the runtime session == the view the model got + its reply."""

    def __init__(self, fetch: Callable[[], list[Message]]) -> None:
        self.fetch = fetch
        self.views: list[list[Message]] = []
        self.checked = 0
        self._pending: tuple[list[BaseMessage], Any] | None = None

    def on_chat_model_start(self, serialized, messages, *, invocation_params=None, **kwargs):
        params = invocation_params or kwargs.get("invocation_params") or {}
        self._pending = (messages[0], params.get("tools"))

    def on_llm_end(self, response, **kwargs):
        assert self._pending is not None
        messages, tools = self._pending
        view = expected_view(messages, tools)
        session = self.fetch()
        assert_same(session[:-1], view)
        check_reply(session, response.generations[0][0].message)
        self.views.append(view)
        self.checked += 1


class AsyncSessionChecker(AsyncCallbackHandler):
    def __init__(self, fetch) -> None:
        self.fetch = fetch
        self.checked = 0
        self._pending = None

    async def on_chat_model_start(self, serialized, messages, *, invocation_params=None, **kwargs):
        params = invocation_params or kwargs.get("invocation_params") or {}
        self._pending = (messages[0], params.get("tools"))

    async def on_llm_end(self, response, **kwargs):
        messages, tools = self._pending
        session = await self.fetch()
        assert_same(session[:-1], expected_view(messages, tools))
        check_reply(session, response.generations[0][0].message)
        self.checked += 1
