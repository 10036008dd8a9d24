"""A finished chat turn in OpenAI's shape, with Leyline's ``leyline`` report: built once for every engine."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from leyline_sdk.protocol import MAX_DIRECTIVES, DirectiveOutcome, TokenLogprob, ToolCall

from .chat_request import AppliedEdit
from .chat_turn import ChatTurn, RebuildReason


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class LeylineReport(BaseModel):
    """What the server did with the request's history (Leyline's extension)."""

    session_id: str | None = Field(description="The bound session; null for a stateless request")
    version: int | None = Field(description="The session's version after the completion; null for a stateless "
                                            "request")
    versions: list[int] = Field(default_factory=list,
                                description="Every session version this request produced, in order (its edits, "
                                            "its appended messages, the reply); empty for a stateless request")
    built: bool = Field(default=False, description="This server did not hold the session and built it from the "
                                                   "request's history")
    rebuilt: bool = Field(default=False, description="The session had existed before this request and was built "
                                                     "again from its history (`rebuild_reason` says why); false "
                                                     "for a new session")
    rebuild_reason: RebuildReason | None = Field(
        default=None,
        description="`evicted`: this server's cache had evicted it; `unknown_session`: this server did not hold "
                    "it and the history already holds an assistant reply (served elsewhere: another replica, "
                    f"this one before a restart); `too_many_edits`: the edit needed more than {MAX_DIRECTIVES:,} "
                    "directives; null when not rebuilt")
    directives_applied: int = 0
    outcomes: list[DirectiveOutcome] = Field(default_factory=list)
    appended_messages: int = 0
    prefilled_tokens: int = Field(description="Prompt tokens computed for this request (the rest came from cache)")


class ContextManagementReport(BaseModel):
    applied_edits: list[AppliedEdit]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
    leyline: LeylineReport
    context_management: ContextManagementReport | None = None


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
    plan = turn.plan
    if plan is None:
        return LeylineReport(session_id=None, version=None, prefilled_tokens=turn.prefilled)
    return LeylineReport(
        session_id=turn.session_id, version=turn.response.version, versions=turn.versions, built=plan.built,
        rebuilt=plan.rebuilt, rebuild_reason=plan.rebuild_reason, directives_applied=len(plan.directives),
        outcomes=turn.outcomes, appended_messages=len(plan.appended), prefilled_tokens=turn.prefilled)


def context_report(turn: ChatTurn) -> ContextManagementReport | None:
    return ContextManagementReport(applied_edits=turn.applied_edits) if turn.applied_edits else None


def completion(turn: ChatTurn, ids: CompletionIds) -> ChatCompletion:
    choice = Choice(message=assistant_message(turn), logprobs=logprobs(turn),
                    finish_reason=turn.response.finish_reason)
    return ChatCompletion(**ids.header("chat.completion"), choices=[choice], usage=usage(turn),
                          leyline=report(turn), context_management=context_report(turn))
