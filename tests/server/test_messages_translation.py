"""An Anthropic Messages request as the chat request the chat turn runs (``leyline_runtime.api.messages_request``):
blocks, system, tools and tool_choice, sampling fields, context_management. Torch-free, no server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from leyline_runtime.api.chat_request import ClearToolUses, NamedToolChoice
from leyline_runtime.api.messages_request import TOOL_ERROR_PREFIX, MessagesRequest, chat_request

TOOL = {"name": "calculator", "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}


def translate(**fields):
    fields.setdefault("model", "m")
    fields.setdefault("max_tokens", 5)
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return chat_request(MessagesRequest.model_validate(fields))


def test_blocks_become_the_chat_messages_in_order():
    chat = translate(system=[{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}], messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                          {"type": "text", "text": "let me see"},
                                          {"type": "tool_use", "id": "t1", "name": "calculator", "input": {"x": "1"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True},
                                     {"type": "text", "text": "and?"}]},
    ])
    got = [(m.role, m.content, m.tool_call_id) for m in chat.messages]
    assert got == [("system", "be\nbrief", None), ("user", "q", None), ("assistant", "let me see", None),
                   ("tool", TOOL_ERROR_PREFIX + "boom", "t1"), ("user", "and?", None)]
    call = chat.messages[2].tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("t1", "calculator", '{"x": "1"}')


@pytest.mark.parametrize("choice,expected,parallel", [
    ({"type": "auto"}, "auto", True), ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", True)])
def test_tool_choice_becomes_the_chat_routes(choice, expected, parallel):
    chat = translate(tools=[TOOL], tool_choice=choice)
    assert chat.tool_choice == expected and chat.parallel_tool_calls is parallel
    assert chat.tools[0].function.parameters == TOOL["input_schema"]


def test_a_named_tool_and_the_sampling_fields_carry_over():
    chat = translate(tools=[TOOL], tool_choice={"type": "tool", "name": "calculator"}, stop_sequences=["END"],
                     temperature=0.5, top_p=0.9, top_k=4, max_tokens=7, stream=True, metadata={"user_id": "u"})
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "calculator"
    assert (chat.stop, chat.temperature, chat.top_p, chat.top_k, chat.effective_max_tokens, chat.stream) == (
        ["END"], 0.5, 0.9, 4, 7, True)


def test_clear_tool_uses_is_the_chat_routes_edit_and_clear_thinking_needs_none():
    edits = [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1}},
             {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
    chat = translate(context_management={"edits": edits})
    assert [type(e) for e in chat.context_management.edits] == [ClearToolUses]
    assert translate(context_management={"edits": edits[1:]}).context_management is None


@pytest.mark.parametrize("fields,words", [
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "tool_use block cannot be in a user message"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [TOOL]}, "'nope', which is not in tools"),
    ({"tool_choice": {"type": "any"}}, "needs tools"),
    ({"tools": [TOOL, TOOL]}, "two tools share a name"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "'document' is not supported"),
    ({"temperature": 1.5}, "less than or equal to 1"),
])
def test_bad_requests_are_refused_by_the_model(fields, words):
    with pytest.raises(ValidationError, match=words):
        translate(**fields)
