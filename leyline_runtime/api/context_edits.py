"""Anthropic-style ``context_management`` edits, made by the server before generating.

``clear_tool_uses_20250919``: once the prompt passes ``trigger`` (input tokens or
tool uses), the results of all tool uses but the last ``keep`` are replaced by a
placeholder (and, with ``clear_tool_inputs``, the calls' arguments by ``{}``),
except for tools in ``exclude_tools``; if that frees fewer than ``clear_at_least``
tokens the edit is skipped. The client keeps sending its full history; the
edited history is what the session holds, so on a bound request each newly
cleared result is one amortize directive and the cache behind it is kept —
the edit Anthropic documents as invalidating its prompt cache.

Engine-agnostic: tokens are counted by the engine's own tokenizer (:class:`MessageTokens`), each
message in the context of the whole history (the bundled runtime's template encodes each message on
its own; vLLM's chat template renders the history, see ``leyline_vllm.api_server.template``).
"""

from __future__ import annotations

from typing import Protocol

from leyline_sdk.protocol import FunctionCall, Message, ToolCall

from .chat_request import AppliedEdit, ClearToolUses, ContextManagement

PLACEHOLDER = "[tool result cleared]"


class MessageTokens(Protocol):
    """An engine's tokenizer, as the edits count with it."""

    def encode_messages(self, messages: list[Message]) -> list[list[int]]:
        """Each message's tokens in the prompt ``messages`` renders."""
        ...


def apply_edits(management: ContextManagement | None, messages: list[Message],
                tokenizer: MessageTokens) -> tuple[list[Message], list[AppliedEdit]]:
    """The history the model is shown, and what was cleared."""
    applied = []
    for edit in management.edits if management else []:
        messages, report = clear_tool_uses(edit, messages, tokenizer)
        if report is not None:
            applied.append(report)
    return messages, applied


def clear_tool_uses(edit: ClearToolUses, messages: list[Message],
                    tokenizer: MessageTokens) -> tuple[list[Message], AppliedEdit | None]:
    def tokens(history: list[Message]) -> int:
        return sum(map(len, tokenizer.encode_messages(history)))

    uses = [i for i, m in enumerate(messages) if m.role == "tool"]
    if edit.trigger.type == "tool_uses" and len(uses) < edit.trigger.value:
        return messages, None
    before = tokens(messages)  # one count of the history: the trigger's size and what the edit frees
    if edit.trigger.type == "input_tokens" and before < edit.trigger.value:
        return messages, None
    names = _tool_names(messages)
    # the newest keep.value tool results; with fewer than that, all of them (a negative start would keep only some)
    keep = set(uses[max(0, len(uses) - edit.keep.value):]) if edit.keep.value else set()
    targets = [i for i in uses if i not in keep and _name(messages[i], names) not in edit.exclude_tools]
    edited = list(messages)
    cleared = []
    for i in targets:
        if messages[i].content != PLACEHOLDER:
            edited[i] = messages[i].model_copy(update={"content": PLACEHOLDER})
            cleared.append(i)
    if edit.clear_tool_inputs:
        call_ids = {messages[i].tool_call_id for i in targets if messages[i].tool_call_id}
        edited = [_clear_inputs(m, call_ids) for m in edited]
    freed = before - tokens(edited)
    if not cleared and freed <= 0 or freed < (edit.clear_at_least.value if edit.clear_at_least else 0):
        return messages, None
    return edited, AppliedEdit(cleared_tool_uses=len(cleared), cleared_input_tokens=freed)


def _tool_names(messages: list[Message]) -> dict[str, str]:
    """tool_call id -> the name of the tool it called."""
    return {c.id: c.function.name for m in messages for c in m.tool_calls or []}


def _name(message: Message, names: dict[str, str]) -> str | None:
    return message.name or names.get(message.tool_call_id or "")


def _clear_inputs(message: Message, call_ids: set[str | None]) -> Message:
    if not message.tool_calls or not any(c.id in call_ids for c in message.tool_calls):
        return message
    calls = [ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments="{}"))
             if c.id in call_ids else c for c in message.tool_calls]
    return message.model_copy(update={"tool_calls": calls})
