"""A finished chat turn in OpenAI's shapes: the completion, and stream chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

from .chat import ChatTurn
from .openai_schema import (
    AssistantMessage,
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    CompletionUsage,
    ContextManagementReport,
    LeylineReport,
    PromptTokensDetails,
)


class CompletionIds:
    """The id, creation time and model name every chunk of one completion shares."""

    def __init__(self, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def header(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def assistant_message(turn: ChatTurn) -> AssistantMessage:
    message = turn.response.message
    content: str | None = message.content
    if message.tool_calls and not content:
        content = None  # OpenAI: no text next to tool calls is null
    return AssistantMessage(content=content, tool_calls=message.tool_calls)


def usage(turn: ChatTurn) -> CompletionUsage:
    u = turn.response.usage
    return CompletionUsage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                           total_tokens=u.prompt_tokens + u.completion_tokens,
                           prompt_tokens_details=PromptTokensDetails(cached_tokens=turn.cached_tokens))


def logprobs(turn: ChatTurn) -> ChoiceLogprobs | None:
    lp = turn.response.logprobs
    return None if lp is None else ChoiceLogprobs(content=lp)


def report(turn: ChatTurn) -> LeylineReport:
    return LeylineReport(
        session_id=turn.session_id, version=turn.response.version if turn.session_id else None,
        versions=turn.versions,
        rebuilt=turn.rebuilt, directives_applied=turn.directives_applied, outcomes=turn.outcomes,
        appended_messages=turn.appended, prefilled_tokens=turn.prefilled)


def completion(turn: ChatTurn, ids: CompletionIds) -> ChatCompletion:
    choice = Choice(message=assistant_message(turn), logprobs=logprobs(turn),
                    finish_reason=turn.response.finish_reason)
    return ChatCompletion(**ids.header("chat.completion"), choices=[choice], usage=usage(turn),
                          leyline=report(turn), context_management=context_report(turn))


def context_report(turn: ChatTurn) -> ContextManagementReport | None:
    return ContextManagementReport(applied_edits=turn.applied_edits) if turn.applied_edits else None


# --- stream chunks -----------------------------------------------------------------------


def chunk(ids: CompletionIds, delta: dict[str, Any], finish_reason: str | None = None,
          **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**ids.header("chat.completion.chunk"), "choices": [choice], **extra}


def tool_call_chunk(turn: ChatTurn, ids: CompletionIds) -> dict[str, Any] | None:
    calls = turn.response.message.tool_calls
    if not calls:
        return None
    deltas = [{"index": i, **c.model_dump(mode="json")} for i, c in enumerate(calls)]
    return chunk(ids, {"tool_calls": deltas})


def final_chunk(turn: ChatTurn, ids: CompletionIds) -> dict[str, Any]:
    body = chunk(ids, {}, turn.response.finish_reason, leyline=report(turn).model_dump(mode="json"))
    edits = context_report(turn)
    if edits is not None:
        body["context_management"] = edits.model_dump(mode="json")
    lp = logprobs(turn)
    if lp is not None:
        body["choices"][0]["logprobs"] = lp.model_dump(mode="json")
    return body


def usage_chunk(turn: ChatTurn, ids: CompletionIds) -> dict[str, Any]:
    return {**ids.header("chat.completion.chunk"), "choices": [], "usage": usage(turn).model_dump(mode="json")}
