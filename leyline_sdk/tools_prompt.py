"""How tools enter the prompt: one system message with a fixed id.

Shared by the runtime (``/v1/chat/completions``) and the LangChain
integration, so both render byte-identical prompts and a session that sees
the same tools again diffs clean. No torch: the SDK owns this contract.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .protocol import FunctionCall, Message, ToolCall

TOOL_CALL = "<|tool_call|>"
END_TOOL_CALL = "<|end_tool_call|>"
TOOLS_MESSAGE_ID = "leyline:tools"
# The tools prompt's first two lines; the runtime encodes the brackets in them as
# the real special tokens (everything else in any message is encoded as text).
_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(END_TOOL_CALL), re.S)
TOOLS_PREAMBLE = "# Tools\nCall a tool with " + TOOL_CALL + '{"name": ..., "arguments": {...}}' + END_TOOL_CALL


def tool_call_payload(call: ToolCall) -> str:
    """The JSON between the tool-call brackets."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except (json.JSONDecodeError, RecursionError):
        arguments = call.function.arguments  # rendered verbatim as a JSON string
    payload = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    try:  # a JSON escape such as "\\ud800" inside the arguments parses to a lone surrogate
        payload.isascii() or payload.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"tool call {call.id!r}: its arguments escape a lone surrogate "
                         "(a \\uD800-\\uDFFF escape without its pair), which is not valid Unicode") from None
    return payload


def render_tool_call(call: ToolCall) -> str:
    return f"{TOOL_CALL}{tool_call_payload(call)}{END_TOOL_CALL}"


def render_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """System-prompt section that lists OpenAI-style function tools."""
    lines = [TOOLS_PREAMBLE]
    for tool in tools:
        fn = tool.get("function", tool)
        spec = {"name": fn.get("name"), "description": fn.get("description", ""),
                "parameters": fn.get("parameters", {})}
        lines.append(json.dumps(spec, ensure_ascii=False, sort_keys=True))
    return "\n".join(lines)


def tools_message(tools: Sequence[Mapping[str, Any]], *, call: str | None = None,
                  required: bool = False) -> Message | None:
    """The tools system message, or ``None`` without tools.

    ``call`` names a tool the model must call now; ``required`` asks for any
    tool call now (one nudge line; there is no constrained decoding).
    """
    if not tools:
        return None
    text = render_tools(tools)
    if call:
        text += f"\nCall the tool {call} now."
    elif required:
        text += "\nCall one of the tools now."
    return Message(role="system", content=text, id=TOOLS_MESSAGE_ID)


def parse_tool_call(payload: str, call_id: str) -> ToolCall | None:
    """The call written between the tool-call markers (``{"name": ..., "arguments": ...}``), or
    None when it is not one; object arguments are re-serialised as the JSON string OpenAI carries."""
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id, function=FunctionCall(name=obj["name"], arguments=arguments))


@dataclass
class ParsedAssistant:
    content: str
    tool_calls: list[ToolCall]
    malformed: list[str]

    def message(self) -> Message:
        return Message(role="assistant", content=self.content, tool_calls=self.tool_calls or None)


def parse_assistant(text: str, call_id_prefix: str | None = None) -> ParsedAssistant:
    """Split generated assistant text into content and tool calls (the bundled runtime's and vLLM's).

    A tool-call block that is not a JSON object with a string ``name`` is kept in
    the content (and reported in ``malformed``) so nothing the model wrote is lost.
    """
    calls: list[ToolCall] = []
    malformed: list[str] = []
    content_parts: list[str] = []
    cursor = 0
    prefix = call_id_prefix or f"call_{uuid.uuid4().hex[:12]}"
    for match in _TOOL_CALL_RE.finditer(text):
        content_parts.append(text[cursor:match.start()])
        cursor = match.end()
        call = parse_tool_call(match.group(1), f"{prefix}_{len(calls)}")
        if call is None:
            malformed.append(match.group(1))
            content_parts.append(match.group(0))
        else:
            calls.append(call)
    tail = text[cursor:]
    if TOOL_CALL in tail:  # an unterminated call (hit max_tokens or a stop)
        malformed.append(tail[tail.index(TOOL_CALL) + len(TOOL_CALL):])
    content_parts.append(tail)
    return ParsedAssistant("".join(content_parts), calls, malformed)
