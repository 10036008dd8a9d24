"""A finished chat turn in Anthropic's Messages shape: the whole reply, and the SSE events of a stream.

The turn is the chat route's (:class:`~leyline_runtime.api.chat_turn.ChatTurn`); only its shape
changes. ``stop_reason``: ``tool_use`` when the reply calls tools, ``max_tokens`` when the budget
ended it, ``stop_sequence`` when one of the request's stop sequences did (``stop_sequence`` names
it), else ``end_turn``.

``usage`` counts what the engine did with the prompt: ``cache_read_input_tokens`` were reused from
the cache, ``cache_creation_input_tokens`` were computed and kept in a bound session's cache (a
later request of the session reads them), ``input_tokens`` were computed and not kept in a session (a
stateless request). The three add up to the prompt's tokens.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from leyline_sdk.protocol import Message

from .chat_prompt import prompt_messages
from .chat_request import ChatCompletionRequest
from .chat_response import ContextManagementReport, LeylineReport, context_report, report
from .chat_turn import ChatTurn
from .context_edits import MessageTokens, apply_edits
from .messages_errors import anthropic_error_body
from .messages_request import sent_back

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessagesUsage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens computed and not kept in a session")
    output_tokens: int
    cache_read_input_tokens: int = Field(description="Prompt tokens reused from the cache")
    cache_creation_input_tokens: int = Field(description="Prompt tokens computed and kept in the bound session")


class MessageReply(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[TextContent | ToolUseContent]
    model: str
    stop_reason: StopReason
    stop_sequence: str | None = None
    usage: MessagesUsage
    context_management: ContextManagementReport | None = None
    leyline: LeylineReport


class TokenCount(BaseModel):
    input_tokens: int = Field(description="The prompt's tokens, after the request's context_management edits")
    context_management: dict[str, int] | None = Field(
        default=None, description="`original_input_tokens`: before the edits (only when edits were asked)")


def token_count(chat: ChatCompletionRequest, tokenizer: MessageTokens, tokens: Callable[[list[Message]], int],
                edits_asked: bool) -> TokenCount:
    """``count_tokens``' answer on any engine: the prompt after the request's ``context_management`` edits,
    counted by ``tokens`` (the engine's own prompt count, with the reply's header), and before them when the
    request asked for edits (``edits_asked``: clear_thinking alone asks, though it clears nothing here)."""
    original = prompt_messages(chat)
    edited, _ = apply_edits(chat.context_management, original, tokenizer)
    count = tokens(edited)
    if not edits_asked:
        return TokenCount(input_tokens=count)
    return TokenCount(input_tokens=count, context_management={"original_input_tokens": tokens(original)})


@dataclass(frozen=True)
class MessagesTurn:
    """A chat turn answered on the Messages API, with the stop sequence that ended it (None: none did)."""

    turn: ChatTurn
    stop_sequence: str | None = None


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(answered: MessagesTurn) -> StopReason:
    finish = answered.turn.response.finish_reason
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if answered.stop_sequence is not None else "end_turn"


def messages_usage(turn: ChatTurn) -> MessagesUsage:
    computed = turn.prefilled
    kept = turn.plan is not None
    return MessagesUsage(input_tokens=0 if kept else computed, output_tokens=turn.response.usage.completion_tokens,
                         cache_read_input_tokens=turn.cached_tokens,
                         cache_creation_input_tokens=computed if kept else 0)


def tool_uses(turn: ChatTurn) -> list[ToolUseContent]:
    return [ToolUseContent(id=c.id, name=c.function.name, input=json.loads(c.function.arguments or "{}"))
            for c in turn.response.message.tool_calls or []]


def reply_content(turn: ChatTurn) -> list[TextContent | ToolUseContent]:
    """The reply's blocks: a text block when it has text, then one ``tool_use`` block per call."""
    text = turn.response.message.content
    return [*([TextContent(text=text)] if text else []), *tool_uses(turn)]


def reply_sent_back(turn: ChatTurn) -> Message:
    """The reply as the assistant message the client's next request carries (it sends the blocks back)."""
    return sent_back([block.model_dump() for block in reply_content(turn)])


def message_reply(answered: MessagesTurn, msg_id: str, model: str) -> MessageReply:
    turn = answered.turn
    return MessageReply(id=msg_id, content=reply_content(turn), model=model,
                        stop_reason=stop_reason(answered), stop_sequence=answered.stop_sequence,
                        usage=messages_usage(turn), context_management=context_report(turn), leyline=report(turn))


class MessagesStreamShape:
    """Anthropic's stream (a :class:`~leyline_runtime.server.sse.StreamShape`): ``message_start``, a
    ``ping``, one text block whose ``text_delta`` events come as the text does, then one ``tool_use``
    block per call (its input as one ``input_json_delta``), ``message_delta`` (stop reason, usage) and
    ``message_stop``. Each event is also named by its ``type`` (the SDK dispatches on the name)."""

    terminator: str | None = None
    named_events: bool = True

    def __init__(self, msg_id: str, model: str):
        self.msg_id, self.model = msg_id, model

    def opening(self) -> list[dict[str, Any]]:
        start: dict[str, Any] = {"id": self.msg_id, "type": "message", "role": "assistant", "content": [],
                                 "model": self.model, "stop_reason": None, "stop_sequence": None,
                                 "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [{"type": "message_start", "message": start},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "ping"}]

    def delta(self, text: str) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}

    def closing(self, answered: MessagesTurn, rest: str) -> list[dict[str, Any]]:
        events = [self.delta(rest)] if rest else []
        events.append({"type": "content_block_stop", "index": 0})
        for index, use in enumerate(tool_uses(answered.turn), start=1):
            block = {"type": "tool_use", "id": use.id, "name": use.name, "input": {}}
            events += [{"type": "content_block_start", "index": index, "content_block": block},
                       {"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(use.input)}},
                       {"type": "content_block_stop", "index": index}]
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": stop_reason(answered), "stop_sequence": answered.stop_sequence},
                 "usage": messages_usage(answered.turn).model_dump(),
                 "leyline": report(answered.turn).model_dump(mode="json")}
        edits = context_report(answered.turn)
        if edits is not None:
            delta["context_management"] = edits.model_dump(mode="json")
        return [*events, delta, {"type": "message_stop"}]

    def error(self, exc: Exception) -> dict[str, Any]:
        return anthropic_error_body(exc)[1]
