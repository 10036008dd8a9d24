"""Message conversion, tools rendering and tool-call pairing (no runtime session needed)."""

from __future__ import annotations

import json
from copy import deepcopy

from langchain.agents.middleware import ClearToolUsesEdit
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from integration_support import calculator, lookup

from leyline_langchain.convert import (
    TOOLS_MESSAGE_ID,
    from_leyline,
    to_leyline,
    to_leyline_messages,
    tools_message,
    tools_to_openai,
)
from leyline_langchain.pairing import find_orphans, placeholder_id, repair_orphans
from leyline_runtime.text import chat_template as tpl
from leyline_runtime.api.chat_request import ChatCompletionRequest
from leyline_runtime.api.chat_prompt import tools_message as runtime_tools_message
from leyline_sdk import FunctionCall, LeylineClient, LeylineMemory, Message, ToolCall, split_append
from leyline_sdk.batch_plan import plan_batch


def ai_call(msg_id: str, call_id: str, name: str, args: dict) -> AIMessage:
    return AIMessage(content="", id=msg_id, tool_calls=[{"name": name, "args": args, "id": call_id}])


def tool_result(msg_id: str, call_id: str, content: str, name: str = "lookup") -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=call_id, id=msg_id, name=name)


def history() -> list:
    return [
        SystemMessage("You are careful."),
        HumanMessage("port plus 17?", id="u1"),
        ai_call("a1", "c1", "lookup", {"key": "api_prt"}),
        tool_result("t1", "c1", "Error: KeyError"),
        ai_call("a2", "c2", "lookup", {"key": "api_port"}),
        tool_result("t2", "c2", "8080"),
        ai_call("a3", "c3", "calculator", {"expression": "8080 + 17"}),
        tool_result("t3", "c3", "8097", name="calculator"),
    ]


def test_to_leyline_keeps_ids_calls_and_names():
    msgs = to_leyline_messages(history())
    assert [m.role for m in msgs] == ["system", "user"] + ["assistant", "tool"] * 3
    assert msgs[0].id is None and msgs[1].id == "u1"
    call = msgs[2].tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("c1", "lookup", {"key": "api_prt"})
    assert call.function.arguments == json.dumps({"key": "api_prt"}, ensure_ascii=False)
    assert (msgs[3].tool_call_id, msgs[3].name, msgs[3].id) == ("c1", "lookup", "t1")
    # list content: text blocks joined
    assert to_leyline(HumanMessage(content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])).content == "ab"


def test_runtime_message_round_trips_exactly():
    """A message as the runtime generates it comes back from LangChain rendering the same."""
    parsed = tpl.parse_assistant('think<|tool_call|>{"name": "calculator", "arguments": {"expression": "2+3", '
                                 '"note": "é"}}<|end_tool_call|>', call_id_prefix="call_x")
    generated = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls, id="lc-1")
    lc = from_leyline(generated)
    assert isinstance(lc, AIMessage) and lc.tool_calls[0]["args"] == {"expression": "2+3", "note": "é"}
    assert to_leyline(lc) == generated
    # arguments that are not an object: an invalid tool call that converts back to the same call
    odd = Message(role="assistant", content="", id="lc-2",
                  tool_calls=[ToolCall(id="k1", function=FunctionCall(name="f", arguments="[1, 2]"))])
    lc_odd = from_leyline(odd)
    assert lc_odd.tool_calls == [] and lc_odd.invalid_tool_calls[0]["args"] == "[1, 2]"
    assert to_leyline(lc_odd).fingerprint() == odd.fingerprint()
    for m in to_leyline_messages(history()):
        assert to_leyline(from_leyline(m)) == m


def test_tools_message_matches_the_runtime_rendering():
    tools = tools_to_openai([calculator, lookup])
    ours = tools_message(tools)
    assert ours.id == TOOLS_MESSAGE_ID and ours.content == tpl.render_tools(tools)
    for choice in ("auto", "required", {"type": "function", "function": {"name": "lookup"}}):
        request = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": choice})
        assert tools_message(tools, choice) == runtime_tools_message(request)
    assert tools_message([]) is None


def test_repair_drops_orphan_results_and_fills_unanswered_calls():
    msgs = history()
    assert not find_orphans(msgs) and repair_orphans(msgs) is msgs
    # RemoveMessage of the failed call alone leaves its result orphaned
    orphan = msgs[:2] + msgs[3:]
    assert find_orphans(orphan).orphan_results == [2]
    assert [m.id for m in repair_orphans(orphan)] == [None, "u1", "a2", "t2", "a3", "t3"]
    # a dropped result leaves the call unanswered: a placeholder keeps the unit whole
    unanswered = msgs[:3] + msgs[4:]
    assert find_orphans(unanswered).unanswered_calls == [(2, "c1")]
    fixed = repair_orphans(unanswered, "[dropped]")
    assert isinstance(fixed[3], ToolMessage) and fixed[3].tool_call_id == "c1" and fixed[3].content == "[dropped]"
    assert fixed[3].id == placeholder_id("c1") and fixed[3].name == "lookup"
    assert repair_orphans(unanswered, "[dropped]") == fixed  # deterministic: repeated calls diff clean
    assert not find_orphans(fixed)
    # the last message's calls are pending (tools not run yet): left alone
    pending = msgs[:5]
    assert not find_orphans(pending)
    # a result in the wrong unit is an orphan too
    swapped = msgs[:4] + [msgs[4], tool_result("tx", "c1", "late")] + msgs[5:]
    assert find_orphans(swapped).orphan_results == [5]


def test_clear_tool_uses_edits_are_amortized_as_units():
    """ClearToolUsesEdit keeps pairing; with clear_tool_inputs the call and its result go as one directive."""
    memory = LeylineMemory(LeylineClient("http://unused"))  # only the planning: nothing is sent
    old = to_leyline_messages(history())
    for inputs, expected in ((False, 2), (True, 2)):
        edited = deepcopy(history())
        ClearToolUsesEdit(trigger=0, keep=1, clear_tool_inputs=inputs).apply(
            edited, count_tokens=count_tokens_approximately)
        assert not find_orphans(edited)
        new = to_leyline_messages(edited)
        raw, tail = split_append(old, new)
        assert tail == [] and len(raw) == (4 if inputs else 2)
        plan = plan_batch(old, new, policy=memory.policy)
        directives, local = plan.directives, plan.local
        assert not local and len(directives) == expected
        assert all(d.mode == "amortize" for d in directives)
        if inputs:  # [call, result] edited together
            assert [(d.span.start, d.span.end) for d in directives] == [(2, 4), (4, 6)]
