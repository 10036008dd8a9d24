"""Thread ids and sessions of ChatLeyline, against the real runtime (in-process ASGI).

The session id of a thread is ``lg-<thread_id>`` or a ValueError; a ``thread_id`` in the
call's config is honoured outside a graph; a session another memory (process) built is
taken over visibly: ``session_event`` "resynced" and a ThreadSessionWarning.
"""

from __future__ import annotations

import re
import warnings

import pytest
from integration_support import app, client  # noqa: F401  # fixtures

from leyline_langchain import ChatLeyline, ThreadSessionWarning
from leyline_sdk import LeylineMemory
from leyline_sdk.protocol import SESSION_ID_RULE


def test_config_thread_id_is_honoured_outside_a_graph(client):
    memory = LeylineMemory(client)
    model = ChatLeyline.from_memory(memory, max_tokens=2)
    reply = model.invoke("hello", config={"configurable": {"thread_id": "outside-1"}})
    assert reply.response_metadata["session_id"] == "lg-outside-1"
    assert [m.content for m in client.get_session("lg-outside-1", include_messages=True).messages][0] == "hello"
    assert memory.calls(memory.default_thread_id) == []
    streamed = list(model.stream("again", config={"configurable": {"thread_id": "outside-2"}}))
    assert streamed[-1].response_metadata["session_id"] == "lg-outside-2"


def test_a_thread_id_that_cannot_name_a_session_is_refused(client):
    model = ChatLeyline.from_memory(LeylineMemory(client), max_tokens=2)
    with pytest.raises(ValueError, match=re.escape(SESSION_ID_RULE)):
        model.invoke("hello", config={"configurable": {"thread_id": "my thread"}})
    with pytest.raises(ValueError, match="cannot name a session"):
        model.invoke("hello", config={"configurable": {"thread_id": "x" * 200}})


def test_session_events_and_a_takeover_warns(client):
    config = {"configurable": {"thread_id": "shared-1"}}
    first = ChatLeyline.from_memory(LeylineMemory(client), max_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadSessionWarning)
        assert first.invoke("one", config=config).response_metadata["session_event"] == "created"
        assert first.invoke(["one", "two"], config=config).response_metadata["session_event"] == "continued"
    # a second process: its own memory, the same thread id
    second = ChatLeyline.from_memory(LeylineMemory(client), max_tokens=2)
    with pytest.warns(ThreadSessionWarning, match="lg-shared-1"):
        reply = second.invoke("three", config=config)
    assert reply.response_metadata["session_event"] == "resynced"
