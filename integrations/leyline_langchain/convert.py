"""LangChain messages <-> Leyline :class:`~leyline_sdk.protocol.Message`, and tools.

The conversion is lossless for what renders, so a history that goes to the
runtime, comes back as LangChain messages and goes out again diffs clean:

* LangChain message ids travel as ``Message.id`` (an edited message keeps its
  id, so the diff sees a replacement, not a delete + insert);
* tool calls keep their ids; their arguments travel as JSON text written the
  way the runtime writes them (``json.dumps(args, ensure_ascii=False)``), so
  a call the runtime parsed converts back to the very same text;
* a tool call whose arguments are not a JSON object cannot be a LangChain
  ``tool_call``; it becomes an ``invalid_tool_call`` carrying the raw text and
  converts back to the same call.

Tools are rendered client-side into one system message in front of the
history, byte for byte the way the runtime does for ``/v1/chat/completions``
(``leyline_runtime.server.prompt``), with the same fixed id, so repeated calls
with the same tools diff clean and a changed tool list is one replacement.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.utils.function_calling import convert_to_openai_tool

from leyline_sdk.tools_prompt import END_TOOL_CALL, TOOL_CALL, TOOLS_MESSAGE_ID, render_tools
from leyline_sdk.tools_prompt import tools_message as shared_tools_message
from leyline_sdk.protocol import MAX_ID_LENGTH, FunctionCall, Message, ToolCall

__all__ = [
    "END_TOOL_CALL",
    "TOOLS_MESSAGE_ID",
    "TOOL_CALL",
    "from_leyline",
    "from_leyline_chunk",
    "render_tools",
    "runtime_tool_choice",
    "to_leyline",
    "to_leyline_messages",
    "tools_message",
    "tools_to_openai",
]

# The runtime's tool-call markers (leyline_runtime.text.chat_template); the SDK side
# may not import the runtime, so they are repeated here.

_ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
          "system": "system", "developer": "system", "tool": "tool", "function": "tool"}


# --- LangChain -> Leyline ----------------------------------------------------------------


def to_leyline_messages(messages: Iterable[BaseMessage | Message]) -> list[Message]:
    return [to_leyline(m) for m in messages]


def to_leyline(message: BaseMessage | Message) -> Message:
    """One LangChain message as the runtime's :class:`Message` (ids kept)."""
    if isinstance(message, Message):
        return message
    msg_id = _fit_id(message.id)
    if isinstance(message, SystemMessage):
        return Message(role="system", content=_text(message), id=msg_id)
    if isinstance(message, HumanMessage):
        return Message(role="user", content=_text(message), id=msg_id)
    if isinstance(message, AIMessage):  # AIMessageChunk too
        return Message(role="assistant", content=_text(message), id=msg_id,
                       tool_calls=_tool_calls(message) or None)
    if isinstance(message, ToolMessage):
        return Message(role="tool", content=_text(message), id=msg_id,
                       tool_call_id=_fit_id(message.tool_call_id) or "call", name=message.name or None)
    if isinstance(message, FunctionMessage):
        return Message(role="tool", content=_text(message), id=msg_id, name=message.name or None,
                       tool_call_id=_fit_id(message.name) or "call")
    if isinstance(message, ChatMessage):
        role = _ROLES.get(message.role)
        if role is None or role in ("assistant", "tool"):
            # A generic ChatMessage has no tool-call fields; assistant text is fine.
            role = role or "user"
        return Message(role=role, content=_text(message), id=msg_id)  # type: ignore[arg-type]  # checked above
    raise TypeError(f"cannot send a {type(message).__name__} to the runtime")


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    text = str(message.text)
    if text or not content:
        return text
    # Only non-text blocks (e.g. a tool that returned JSON blocks): keep them as JSON.
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def _tool_calls(message: AIMessage) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for index, call in enumerate(message.tool_calls):
        arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
        calls.append(_tool_call(message, index, call.get("id"), call["name"], arguments))
    # Calls whose arguments were not a JSON object (see from_leyline): the raw text.
    for index, invalid in enumerate(message.invalid_tool_calls, start=len(calls)):
        name, call_id, raw = invalid.get("name"), invalid.get("id"), invalid.get("args")
        if name and call_id:
            calls.append(_tool_call(message, index, call_id, name, raw if isinstance(raw, str) else json.dumps(raw)))
    return calls


def _tool_call(message: AIMessage, index: int, call_id: str | None, name: str, arguments: str) -> ToolCall:
    # A call without an id still needs one; derive it from the message so it is stable.
    cid = _fit_id(call_id) or f"call_{_digest(str(message.id))[:12]}_{index}"
    return ToolCall(id=cid, function=FunctionCall(name=name[:256], arguments=arguments))


def _fit_id(value: str | None) -> str | None:
    if not value:
        return None
    if len(value) <= MAX_ID_LENGTH:
        return value
    return f"h:{_digest(value)}"  # stable, and short enough for the wire


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- Leyline -> LangChain ----------------------------------------------------------------


def from_leyline(message: Message, **fields: Any) -> BaseMessage:
    """A runtime :class:`Message` as a LangChain message (``fields`` go to its constructor)."""
    kw: dict[str, Any] = {"content": message.content, "id": message.id, **fields}
    if message.role == "system":
        return SystemMessage(**kw)
    if message.role == "user":
        return HumanMessage(**kw)
    if message.role == "tool":
        return ToolMessage(tool_call_id=message.tool_call_id or "", name=message.name, **kw)
    valid, invalid = [], []
    for call in message.tool_calls or []:
        args = _json_object(call.function.arguments)
        if args is None:
            invalid.append(invalid_tool_call(name=call.function.name, args=call.function.arguments,
                                             id=call.id, error="arguments are not a JSON object"))
        else:
            valid.append(tool_call(name=call.function.name, args=args, id=call.id))
    return AIMessage(tool_calls=valid, invalid_tool_calls=invalid, **kw)


def from_leyline_chunk(message: Message, **fields: Any) -> AIMessageChunk:
    """The generated assistant message as the final stream chunk (``content=""`` in ``fields``
    when its text was streamed before)."""
    chunks = [tool_call_chunk(name=c.function.name, args=c.function.arguments, id=c.id, index=i)
              for i, c in enumerate(message.tool_calls or [])]
    return AIMessageChunk(**{"content": message.content, **fields}, id=message.id, tool_call_chunks=chunks,
                          chunk_position="last")


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


# --- tools ---------------------------------------------------------------------------------


def tools_to_openai(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools (BaseTool, functions, pydantic models, dicts) as OpenAI function schemas."""
    return [convert_to_openai_tool(t) for t in tools]


def tools_message(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None) -> Message | None:
    """The tools system message (fixed id) for ``tools``, or ``None`` without tools.

    ``tool_choice`` adds the runtime's one-line nudge: a tool name (or an
    OpenAI named choice) → call that tool now; ``"required"`` / ``"any"`` /
    ``True`` → call one of the tools now. ``"none"`` keeps the prompt (and the
    cache) as is; the runtime masks the tool-call token instead.
    """
    return shared_tools_message(tools or [], call=_named_choice(tool_choice),
                                required=tool_choice in ("required", "any", True))


def runtime_tool_choice(choice: Any) -> str | dict[str, Any] | None:
    """LangChain's ``tool_choice`` in OpenAI's terms, as the runtime enforces it."""
    if choice is None or choice == "auto":
        return None
    if choice in ("required", "any", True):
        return "required"
    if choice == "none" or choice is False:
        return "none"
    name = _named_choice(choice)
    return {"type": "function", "function": {"name": name}} if name else None


def _named_choice(choice: Any) -> str | None:
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        return str(name) if name else None
    if isinstance(choice, str) and choice not in ("auto", "none", "required", "any"):
        return choice
    return None
