"""The runtime's chat template.

Every message renders on its own: ``<|role|>`` header, body text, ``<|end|>``.
Messages never share a token, so a history's tokens are the concatenation of
per-message tokens and the segment table (message -> token range) is exact.

Tool-call text format (what the model writes after ``<|assistant|>``)::

    optional text<|tool_call|>{"name": "calculator", "arguments": {"expression": "2+3"}}<|end_tool_call|><|end|>

Tool results render as ``<|tool|>`` + content + ``<|end|>``. Tool call ids are
not rendered: results follow their calls in order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from leyline_sdk.protocol import Message, ToolCall
from leyline_sdk.tools_prompt import (  # noqa: F401 (part of the template)
    END_TOOL_CALL,
    TOOL_CALL,
    ParsedAssistant,
    parse_assistant,
    parse_tool_call,
    render_tool_call,
    render_tools,
    tool_call_payload,
)

ROLE_TOKENS = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
END = "<|end|>"
END_OF_TEXT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, END_OF_TEXT, *ROLE_TOKENS.values(), END, TOOL_CALL, END_TOOL_CALL]

def render_body(message: Message) -> str:
    """The text between the role header and the end marker."""
    body = message.content
    if message.role == "tool" and message.name:
        body = f"[{message.name}] {body}"
    for call in message.tool_calls or []:
        body += render_tool_call(call)
    return body


def render_message(message: Message) -> str:
    return f"{ROLE_TOKENS[message.role]}{render_body(message)}{END}"


def parse_assistant_tokens(ids: list[int], decode: Callable[[list[int]], str], tool_call_id: int,
                           end_tool_call_id: int, call_id_prefix: str | None = None,
                           stop: str | None = None) -> ParsedAssistant:
    """Split generated token ids into content and tool calls.

    Only the template's own special ids open and close a call: text that merely
    *spells* the markup is content, like any other data. An unterminated or
    malformed call (hit ``max_tokens``, or an unconstrained model wrote bad JSON) never
    reaches ``content``; it is reported in ``malformed``. ``stop`` (a stop string the
    engine hit) cuts the text where it starts, and drops everything after it.
    """
    calls: list[ToolCall] = []
    malformed: list[str] = []
    content: list[str] = []
    prefix = call_id_prefix or f"call_{uuid.uuid4().hex[:12]}"
    full = decode(ids)
    cut = full.index(stop) if stop is not None and stop in full else len(full)
    cursor = 0  # where the current segment starts in the decoded text
    marker = {"text": 0, "open": len(TOOL_CALL), "call": len(TOOL_CALL) + len(END_TOOL_CALL)}
    for kind, part in _segments(ids, tool_call_id, end_tool_call_id):
        if cursor >= cut:
            break
        text = decode(part)
        if kind == "text":
            content.append(text[:cut - cursor])
        elif kind == "call" and cursor + len(text) + marker[kind] <= cut:
            call = parse_tool_call(text, f"{prefix}_{len(calls)}")
            if call is None:
                malformed.append(text)
            else:
                calls.append(call)
        else:  # cut short by the end of generation or a stop string
            malformed.append(text)
        cursor += len(text) + marker[kind]
    return ParsedAssistant("".join(content), calls, malformed)


def _segments(ids: list[int], open_id: int, close_id: int) -> list[tuple[str, list[int]]]:
    """("text", ids) runs and ("call", ids) blocks; a block without its close is ("open", ids)."""
    out: list[tuple[str, list[int]]] = []
    kind, run = "text", []
    for tok in ids:
        if tok == open_id:
            if run or kind != "text":
                out.append((kind if kind == "text" else "open", run))
            kind, run = "open", []
        elif tok == close_id and kind == "open":
            out.append(("call", run))
            kind, run = "text", []
        else:
            run.append(tok)
    if run or kind == "open":
        out.append((kind, run))
    return out

