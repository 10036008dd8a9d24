"""What Claude Code (``@anthropic-ai/claude-code`` 2.1.328, ``claude -p``) sends on ``/v1/messages``, taken as
it sends it: its first request, recorded at a real ``leyline-runtime serve`` (the fields kept, the long texts
cut), was a 400 on five of them before (a mid-conversation ``system`` turn, a tool with ``defer_loading``,
``max_tokens`` 32000, ``thinking`` ``adaptive``, ``output_config.effort``). The translation in isolation, then
the same shape through the ``anthropic`` SDK on a served runtime."""

from __future__ import annotations

import anthropic
import pytest
from pydantic import ValidationError
from served_runtime import API_KEY, server  # noqa: F401 - server is a fixture

from leyline_runtime.api.chat_request import MAX_NEW_TOKENS
from leyline_runtime.api.messages_request import MessagesRequest, chat_request

BASH = {"name": "Bash", "description": "Run a bash command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
DEFERRED = {"name": "DeferredToolPlaceholder", "description": "Reserved placeholder; never call this tool.",
            "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}


def claude_code_request(**override) -> dict:
    """Claude Code 2.1.328's first request for ``claude -p "Run hello.py ..."``, its texts cut short."""
    body = {
        "model": "leyline-default",
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328.883; cc_entrypoint=sdk-cli;"},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\nAttribution ...\n</system-reminder>\n"},
                                         {"type": "text", "text": "Run hello.py with python3 and tell me what it prints."}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Primary working directory: /tmp/w",
                                           "cache_control": {"type": "ephemeral"}}]},
        ],
        "tools": [BASH, DEFERRED],
        "metadata": {"user_id": '{"device_id":"6360e49f","account_uuid":"","session_id":"a2f2efe4"}'},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "updates"},  # then "omitted", then no display
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }
    body.update(override)
    return body


def test_claude_codes_first_request_is_taken_and_translated():
    chat = chat_request(MessagesRequest.model_validate(claude_code_request()))
    roles = [(m.role, m.content.split("\n")[0]) for m in chat.messages]
    # the mid-conversation system turn stays a system message where it was
    assert roles == [("system", "x-anthropic-billing-header: cc_version=2.1.328.883; cc_entrypoint=sdk-cli;"),
                     ("user", "<system-reminder>"), ("system", "# Environment")]
    assert [t.function.name for t in chat.tools] == ["Bash"]  # the deferred tool stays out of the prompt
    assert chat.max_tokens == MAX_NEW_TOKENS < 32000  # the server's own cap on one reply
    assert chat.context_management is None  # clear_thinking is met by construction, nothing to clear


@pytest.mark.parametrize("override,named", [
    ({"messages": [{"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]}]},
     "tool_use block cannot be in a system message"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"tool_choice": {"type": "tool", "name": "DeferredToolPlaceholder"}}, "deferred"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_what_it_may_not_send_is_still_named(override, named):
    with pytest.raises(ValidationError) as caught:
        MessagesRequest.model_validate(claude_code_request(**override))
    assert named in str(caught.value)


def test_the_sdk_sends_the_same_shape_to_a_served_runtime(server):  # noqa: F811
    url, _ = server
    client = anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0)
    body = claude_code_request(max_tokens=6, stream=False)
    reply = client.messages.create(
        model=body["model"], system=body["system"], messages=body["messages"], tools=body["tools"],
        max_tokens=6, metadata={"user_id": body["metadata"]["user_id"]}, thinking=body["thinking"],
        extra_body={"temperature": 0, "output_config": body["output_config"],
                    "context_management": body["context_management"]},
        extra_headers={"anthropic-beta": "claude-code-20250219,context-management-2025-06-27"})
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.usage.output_tokens > 0
    assert all(b.type in ("text", "tool_use") for b in reply.content)  # no thinking block: the model writes none
    assert client.messages.count_tokens(model=body["model"], system=body["system"], messages=body["messages"],
                                        tools=body["tools"], thinking=body["thinking"]).input_tokens > 0
