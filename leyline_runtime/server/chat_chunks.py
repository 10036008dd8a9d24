"""A finished chat turn as the last chunks of an OpenAI stream (``chat.completion.chunk``).

The bundled runtime streams chat replies; the pieces a chunk carries (usage, logprobs, the
``leyline`` report) are built as for a whole completion (:mod:`leyline_runtime.api.chat_response`).
"""

from __future__ import annotations

from typing import Any

from ..api.chat_response import CompletionIds, context_report, logprobs, report, usage
from ..api.chat_turn import ChatTurn


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
