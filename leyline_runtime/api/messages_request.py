"""Anthropic's Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``), and its
translation into the chat request every engine already serves.

The Messages API is not a second chat turn: :func:`chat_request` rewrites a request into a
:class:`~leyline_runtime.api.chat_request.ChatCompletionRequest` and the chat turn runs it, so the
session binding, the directives, the constrained decoding and ``context_management`` are the chat
route's own. The translation:

* ``system`` (a string or text blocks) is the first message, with the role ``system``; a message of the
  role ``system`` (Claude Code's mid-conversation system turns) stays a system message where it is;
* a ``text`` block is text; a message's text blocks are joined by a newline;
* a ``tool_use`` block is a tool call whose arguments are ``json.dumps(input)``;
* a ``tool_result`` block is a ``tool`` message answering its ``tool_use_id``, before the user's
  own text; with ``is_error`` its text starts with :data:`TOOL_ERROR_PREFIX` (the prompt has no
  other way to tell the model);
* ``thinking`` and ``redacted_thinking`` blocks are dropped: the chat template has no place for
  them, as Anthropic's own API drops earlier turns' thinking from the context;
* ``tools`` become function tools (``input_schema`` as their parameters), and ``tool_choice``
  ``auto``/``any``/``tool``/``none`` becomes ``auto``/``required``/a named tool/``none``, decoded
  under the same grammar; ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``;
* ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` and ``max_tokens`` keep their meaning; a
  ``max_tokens`` over the server's :data:`MAX_NEW_TOKENS` is cut to it (the reply then ends with
  ``stop_reason: max_tokens`` there);
* a tool with ``defer_loading`` stays out of the prompt and the grammar (Anthropic loads a deferred
  tool when its tool search finds it; nothing searches here);
* ``thinking`` and ``output_config.effort`` are accepted and change nothing: the served model writes no
  thinking blocks and has no effort levels;
* ``cache_control``, ``service_tier`` and ``citations`` are accepted and change nothing (Leyline's
  cache follows the session, not a marker); ``metadata.user_id`` narrows which held session a request
  without a session id may continue (:mod:`.continuation`);
* ``context_management``'s ``clear_tool_uses_20250919`` is the chat route's edit;
  ``clear_thinking_20251015`` is met by construction (no thinking block reaches the prompt) and is
  never reported as applied.

Any other field or block type is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from leyline_sdk.json_numbers import JsonModel
from leyline_sdk.protocol import MAX_ID_LENGTH, FunctionCall, Message, ToolCall

from .chat_request import (
    MAX_NEW_TOKENS,
    MAX_STOP_STRINGS,
    ChatCompletionRequest,
    ClearToolUses,
    ContextManagement,
)

MAX_CLIENT_TOKENS = 1 << 20  # the largest max_tokens taken (and cut to MAX_NEW_TOKENS)
TOOL_ERROR_PREFIX = "Error: "  # a tool_result with is_error: true
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"  # Anthropic's rule for a tool's name


class _Block(JsonModel):
    model_config = ConfigDict(extra="forbid")

    cache_control: dict[str, Any] | None = Field(default=None, description="Accepted; not used")


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = Field(default=None, description="Accepted; not used")


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    content: str | list[TextBlock] = ""
    is_error: StrictBool = False


BLOCK_TYPES = ("text", "thinking", "redacted_thinking", "tool_use", "tool_result")
ContentBlock = Annotated[TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
                         Field(discriminator="type")]


class MessageParam(JsonModel):
    model_config = ConfigDict(extra="forbid")

    # system: a mid-conversation system turn (Claude Code sends them: "mid-conversation-tool-changes")
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, value: Any) -> Any:
        # named here: the union's own error would only say the content is not a string
        for block in value if isinstance(value, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_TYPES:
                raise ValueError(f"a content block of type {kind!r} is not supported here; "
                                 f"the types are {', '.join(BLOCK_TYPES)}")
        return value

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> MessageParam:
        misplaced = {"assistant": ("tool_result",), "user": ("tool_use",),
                     "system": ("tool_use", "tool_result")}[self.role]
        found = next((b.type for b in self.content if b.type in misplaced), None) \
            if not isinstance(self.content, str) else None
        if found:
            raise ValueError(f"a {found} block cannot be in a {self.role} message")
        return self


class ToolParam(JsonModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = Field(default=None, description="Accepted; not used")
    defer_loading: StrictBool = Field(default=False, description="A deferred tool stays out of the prompt "
                                      "(Anthropic loads one when its tool search finds it; nothing searches here)")


class ToolChoiceAuto(JsonModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto"]
    disable_parallel_tool_use: StrictBool = False


class ToolChoiceAny(JsonModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["any"]
    disable_parallel_tool_use: StrictBool = False


class ToolChoiceTool(JsonModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    disable_parallel_tool_use: StrictBool = False


class ToolChoiceNone(JsonModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["none"]


ToolChoiceParam = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
                            Field(discriminator="type")]


class ClearThinking(JsonModel):
    """Anthropic's ``clear_thinking_20251015``: met by construction here (no thinking reaches the prompt)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["clear_thinking_20251015"]
    keep: dict[str, Any] | Literal["all"] | None = None


class MessagesContextManagement(JsonModel):
    model_config = ConfigDict(extra="forbid")

    # no discriminator: clear_tool_uses' type has a default, as on the chat route
    edits: list[ClearToolUses | ClearThinking] = Field(max_length=8)


class Metadata(JsonModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str | None = Field(default=None, max_length=256,
                                description="Narrows which held session a request without a session id may "
                                            "continue to this user's (leyline_runtime.api.continuation)")


class ThinkingConfig(JsonModel):
    """Anthropic's ``thinking``: accepted; the served model writes no thinking blocks, so none are sent."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)
    # Claude Code 2.1.328 tries "updates", then "omitted", then none: any value, as it changes nothing here
    display: str | None = Field(default=None, max_length=32)


class OutputConfig(JsonModel):
    """Anthropic's ``output_config``: ``effort`` accepted and not used (a model without effort levels)."""

    model_config = ConfigDict(extra="forbid")

    effort: Literal["low", "medium", "high", "max"] | None = None


class MessagesPrompt(JsonModel):
    """What a prompt is made of: the body of ``/v1/messages/count_tokens``, and the core of ``/v1/messages``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoiceParam | None = None
    context_management: MessagesContextManagement | None = None
    thinking: ThinkingConfig | None = None

    @model_validator(mode="after")
    def _tool_choice_has_tools(self) -> MessagesPrompt:
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools share a name")
        names = [t.name for t in self.tools or [] if not t.defer_loading]
        choice = self.tool_choice
        if isinstance(choice, ToolChoiceTool) and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not in tools (or is deferred)")
        if isinstance(choice, ToolChoiceAny) and not names:
            raise ValueError("tool_choice 'any' needs tools")
        return self


class MessagesRequest(MessagesPrompt):
    # any bound: a reply is cut at the server's own MAX_NEW_TOKENS (Claude Code asks 32000 of a model it does
    # not know), ending with stop_reason max_tokens as at the client's own bound
    max_tokens: int = Field(ge=1, le=MAX_CLIENT_TOKENS)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    stream: StrictBool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(default=None, description="Accepted; not used")
    cache_control: dict[str, Any] | None = Field(default=None, description="Accepted; not used")
    output_config: OutputConfig | None = None


def chat_request(body: MessagesPrompt) -> ChatCompletionRequest:
    """``body`` as the chat request the chat turn runs (see the module docstring)."""
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": _system(body.system) + [m for message in body.messages for m in _chat_messages(message)],
    }
    tools = [t for t in body.tools or [] if not t.defer_loading]
    if tools:
        fields["tools"] = [{"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description is not None else {})}} for t in tools]
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                                 if isinstance(choice, ToolChoiceTool) else
                                 {"auto": "auto", "any": "required", "none": "none"}[choice.type])
        if not isinstance(choice, ToolChoiceNone) and choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    edits = [e for e in body.context_management.edits if isinstance(e, ClearToolUses)] \
        if body.context_management else []
    if edits:
        fields["context_management"] = ContextManagement(edits=edits)
    if isinstance(body, MessagesRequest):
        fields.update(max_tokens=min(body.max_tokens, MAX_NEW_TOKENS), stream=body.stream, temperature=body.temperature,
                      top_p=body.top_p, top_k=body.top_k, stop=[s for s in body.stop_sequences or [] if s] or None)
    return ChatCompletionRequest.model_validate(fields)


def _text(blocks: list[TextBlock]) -> str:
    return "\n".join(b.text for b in blocks)


def _system(system: str | list[TextBlock] | None) -> list[Message]:
    if system is None:
        return []
    return [Message(role="system", content=system if isinstance(system, str) else _text(system))]


def sent_back(content: list[dict[str, Any]]) -> Message:
    """A reply's content blocks as the assistant message the next request's translation makes of them,
    when the client sends them back (it does, verbatim: the history is the client's)."""
    if not content:
        return Message(role="assistant", content="")
    return _chat_messages(MessageParam.model_validate({"role": "assistant", "content": content}))[0]


def _chat_messages(message: MessageParam) -> list[Message]:
    if isinstance(message.content, str):
        return [Message(role=message.role, content=message.content)]
    if message.role == "system":
        return [Message(role="system", content=_text([b for b in message.content if isinstance(b, TextBlock)]))]
    if message.role == "assistant":
        texts = [b for b in message.content if isinstance(b, TextBlock)]
        calls = [ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=json.dumps(b.input)))
                 for b in message.content if isinstance(b, ToolUseBlock)]
        return [Message(role="assistant", content=_text(texts), tool_calls=calls or None)]
    out: list[Message] = []
    texts = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            if texts:  # text before a result stays before it
                out.append(Message(role="user", content=_text(texts)))
                texts = []
            result = block.content if isinstance(block.content, str) else _text(block.content)
            out.append(Message(role="tool", tool_call_id=block.tool_use_id,
                               content=TOOL_ERROR_PREFIX + result if block.is_error else result))
        elif isinstance(block, TextBlock):
            texts.append(block)
    if texts or not out:
        out.append(Message(role="user", content=_text(texts)))
    return out
