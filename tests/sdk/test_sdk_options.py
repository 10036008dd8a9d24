"""Generate options come from the protocol's model: every surface accepts every option it defines."""

from __future__ import annotations

import inspect

import pytest
from integration_support import app, client  # noqa: F401  (fixtures)

from leyline_sdk import LeylineMemory, Message
from leyline_sdk.protocol import GenerateRequest, GenerateResponse

# What a caller passes besides the history: the model's fields less the request's own framing.
OPTIONS = sorted(set(GenerateRequest.model_fields) - {"messages", "expected_version", "stream"})


def defaults() -> dict:
    return {name: GenerateRequest.model_fields[name].get_default(call_default_factory=True) for name in OPTIONS}


def view() -> list[Message]:
    return [Message(role="system", content="Be brief.", id="s"), Message(role="user", content="hi", id="u1")]


def test_the_option_list_is_not_empty_and_includes_min_tokens():
    assert "min_tokens" in OPTIONS and "max_tokens" in OPTIONS and "response_format" in OPTIONS


def test_memory_generate_accepts_every_protocol_option(client):  # noqa: F811
    memory = LeylineMemory(client)
    memory.generate("opts", view(), message_id="r1", **{**defaults(), "max_tokens": 4, "min_tokens": 3})
    stats = memory.last_call("opts")
    assert stats.completion_tokens >= 3  # min_tokens reached the runtime, not just the signature


def test_memory_generate_stream_accepts_every_protocol_option(client):  # noqa: F811
    memory = LeylineMemory(client)
    events = list(memory.generate_stream("opts-s", view(), message_id="r1",
                                         **{**defaults(), "max_tokens": 4, "min_tokens": 3}))
    final = events[-1]
    assert isinstance(final, GenerateResponse) and final.usage.completion_tokens >= 3


@pytest.mark.parametrize("method", [LeylineMemory.generate, LeylineMemory.generate_stream])
def test_unknown_option_is_a_type_error_not_dropped(client, method):  # noqa: F811
    memory = LeylineMemory(client)
    with pytest.raises(TypeError, match="max_token"):
        result = method(memory, "opts-x", view(), max_token=5)
        if inspect.isgenerator(result):
            list(result)


def test_client_and_memory_share_one_option_list():
    from leyline_sdk import _calls, memory

    assert _calls.GENERATE_OPTIONS == frozenset(OPTIONS)
    assert memory.GENERATE_OPTIONS is _calls.GENERATE_OPTIONS
