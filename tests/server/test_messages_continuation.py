"""Messages requests that name no session continue the held session whose history they carry
(``leyline_runtime.api.continuation``), on a real ``leyline-runtime serve`` through the real ``anthropic``
SDK: the second turn reads the first's rows, ``context_management``'s clears become directives on it, a
streamed turn continues as a whole one does; another API key, ``metadata.user_id`` or Claude Code session
header with the same history never continues it, and a history the client edited is a new session,
answered as usual.
"""

from __future__ import annotations

import anthropic
import pytest
from served_runtime import ADMIN_KEY, API_KEY, server  # noqa: F401 - server is a fixture

MODEL = "leyline-default"
GREEDY = {"temperature": 0}
CALCULATOR = {"name": "calculator", "description": "Evaluate an arithmetic expression",
              "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                               "required": ["expression"]}}
NONE = {"type": "none"}  # the tools stay in the prompt; the replies call none, so the tool uses are the history's
CLEAR = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
         "keep": {"type": "tool_uses", "value": 1}}


@pytest.fixture(scope="module")
def client(server):  # noqa: F811 - the fixture
    return anthropic.Anthropic(base_url=server[0], api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def other_key(server):  # noqa: F811 - a second API key: a tenant of its own
    return anthropic.Anthropic(base_url=server[0], api_key=ADMIN_KEY, max_retries=0)


def create(client, messages, **fields):
    extra = {**GREEDY, **fields.pop("extra_body", {})}
    return client.messages.create(model=MODEL, max_tokens=fields.pop("max_tokens", 6), messages=messages,
                                  extra_body=extra, **fields)


def leyline(reply) -> dict:
    return reply.model_extra["leyline"]


def sent_back(reply) -> dict:
    """The reply as the client sends it back in its next request."""
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}


def opening(topic: str) -> list[dict]:
    return [{"role": "user", "content": f"Tell me about {topic}, briefly."}]


def tool_history(results: list[str]) -> list[dict]:
    history: list[dict] = [{"role": "user", "content": "What is 17 * 23? Check it step by step."}]
    for i, text in enumerate(results):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "calculator", "input": {"expression": f"{i} + 1"}}
        history += [{"role": "assistant", "content": [use]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": text}]}]
    return history


def test_turns_without_a_session_id_continue_the_session_and_clears_become_its_directives(client):
    history = tool_history(["a long first result " * 8, "a long second result " * 8, "third"])
    first = create(client, history, tools=[CALCULATOR], tool_choice=NONE)
    session = leyline(first)["session_id"]
    assert leyline(first)["built"] and first.usage.cache_read_input_tokens == 0
    history += [sent_back(first), {"role": "user", "content": "go on"}]
    cm = {"context_management": {"edits": [CLEAR]}}
    second = create(client, history, tools=[CALCULATOR], tool_choice=NONE, extra_body=cm)
    report = leyline(second)
    assert report["session_id"] == session and not report["built"] and report["rebuild_reason"] is None
    assert second.usage.cache_read_input_tokens > 0
    # the two older results, newly cleared: two directives on the continued session
    applied = second.model_extra["context_management"]["applied_edits"]
    assert [(e["type"], e["cleared_tool_uses"]) for e in applied] == [("clear_tool_uses_20250919", 2)]
    assert report["directives_applied"] == 2 and len(report["outcomes"]) == 2
    assert all(o["delta"] < 0 for o in report["outcomes"])
    # a streamed turn continues it too, and is found again by what the stream delivered
    history += [sent_back(second), {"role": "user", "content": "and then?"}]
    with client.messages.stream(model=MODEL, max_tokens=6, messages=history, tools=[CALCULATOR],
                                tool_choice=NONE, extra_body={**GREEDY, **cm}) as stream:
        third = stream.get_final_message()
    history += [sent_back(third), {"role": "user", "content": "done?"}]
    fourth = create(client, history, tools=[CALCULATOR], tool_choice=NONE, extra_body=cm)
    assert leyline(fourth)["session_id"] == session and not leyline(fourth)["built"]
    assert leyline(fourth)["directives_applied"] == 0  # cleared before: nothing new to clear
    assert fourth.usage.cache_read_input_tokens > second.usage.cache_read_input_tokens


def test_another_api_key_with_the_same_history_gets_a_session_of_its_own(client, other_key):
    history = opening("tenants")
    first = create(client, history)
    owned = leyline(first)["session_id"]
    history += [sent_back(first), {"role": "user", "content": "more"}]
    theirs = create(other_key, history)
    # the other key's tenant holds nothing this history continues: built from its history, nothing read
    assert leyline(theirs)["built"] and theirs.usage.cache_read_input_tokens == 0
    assert leyline(theirs)["session_id"] != owned
    mine = create(client, history)
    assert leyline(mine)["session_id"] == owned and not leyline(mine)["built"]
    assert mine.usage.cache_read_input_tokens > 0
    # and the other key continues the session it got, not the owner's
    again = create(other_key, [*history, sent_back(theirs), {"role": "user", "content": "again"}])
    assert leyline(again)["session_id"] == leyline(theirs)["session_id"] and not leyline(again)["built"]


def test_metadata_user_id_narrows_whose_session_a_request_continues(client):
    history = opening("users")
    first = create(client, history, metadata={"user_id": "alice"})
    history += [sent_back(first), {"role": "user", "content": "more"}]
    bob = create(client, history, metadata={"user_id": "bob"})
    assert leyline(bob)["built"] and leyline(bob)["session_id"] != leyline(first)["session_id"]
    alice = create(client, history, metadata={"user_id": "alice"})
    assert leyline(alice)["session_id"] == leyline(first)["session_id"] and not leyline(alice)["built"]


def test_claude_codes_session_header_narrows_it_too(client):
    history = opening("client sessions")
    first = create(client, history, extra_headers={"x-claude-code-session-id": "cc-one"})
    history += [sent_back(first), {"role": "user", "content": "more"}]
    other = create(client, history, extra_headers={"x-claude-code-session-id": "cc-two"})
    assert leyline(other)["built"] and leyline(other)["session_id"] != leyline(first)["session_id"]
    same = create(client, history, extra_headers={"x-claude-code-session-id": "cc-one"})
    assert leyline(same)["session_id"] == leyline(first)["session_id"] and not leyline(same)["built"]


def test_a_history_the_client_edited_is_a_miss_answered_from_a_new_session(client):
    first = create(client, opening("misses"))
    edited = [*opening("something else"), sent_back(first), {"role": "user", "content": "more"}]
    reply = create(client, edited)
    report = leyline(reply)
    assert report["built"] and report["session_id"] != leyline(first)["session_id"]
    assert reply.usage.cache_read_input_tokens == 0 and reply.content
    # the first session is still found by its own history
    again = create(client, [*opening("misses"), sent_back(first), {"role": "user", "content": "more"}])
    assert leyline(again)["session_id"] == leyline(first)["session_id"]


def test_a_named_session_is_never_found_by_its_history(client):
    bound = {"extra_headers": {"X-Leyline-Session": "named-not-indexed"}}
    first = create(client, opening("names"), **bound)
    reply = create(client, [*opening("names"), sent_back(first), {"role": "user", "content": "more"}])
    assert leyline(reply)["built"] and leyline(reply)["session_id"] != "named-not-indexed"


def test_a_moved_cache_control_breakpoint_still_continues(client):
    """Claude Code marks its history's last block with ``cache_control`` and moves the mark each turn:
    the mark is no part of what renders, so the history still continues the session."""
    marked = {"type": "ephemeral"}
    first = create(client, [{"role": "user", "content": [
        {"type": "text", "text": "Tell me about breakpoints, briefly.", "cache_control": marked}]}])
    history = [{"role": "user", "content": [{"type": "text", "text": "Tell me about breakpoints, briefly."}]},
               sent_back(first),
               {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": marked}]}]
    second = create(client, history)
    assert leyline(second)["session_id"] == leyline(first)["session_id"] and not leyline(second)["built"]
    assert second.usage.cache_read_input_tokens > 0
