"""From a chat request to what an engine runs: the prompt's messages and the generation's sampling.

Tools become one system message in front of the history. It renders
deterministically and carries a fixed id, so a session that sees the same
tools again diffs clean, and changed tools become one (token-minimised)
message replacement rather than a rebuild. ``tool_choice: "none"`` keeps the
tools in the prompt (so toggling it keeps the history cached); each engine
keeps the reply from calling one its own way.
"""

from __future__ import annotations

from typing import Any

from leyline_sdk.protocol import GenerateRequest, Message
from leyline_sdk.tools_prompt import tools_message as shared_tools_message

from .chat_request import ChatCompletionRequest, NamedToolChoice

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default


def tools_message(request: ChatCompletionRequest) -> Message | None:
    choice = request.tool_choice
    return shared_tools_message(
        [t.model_dump(exclude_none=True) for t in request.tools or []],
        call=choice.function.name if isinstance(choice, NamedToolChoice) else None,
        required=choice == "required")


def prompt_messages(request: ChatCompletionRequest) -> list[Message]:
    tools = tools_message(request)
    return ([tools] if tools else []) + list(request.messages)


def stop_strings(request: ChatCompletionRequest) -> list[str]:
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return [s for s in stops if s]


def generate_request(request: ChatCompletionRequest, *, messages: list[Message] | None = None,
                     expected_version: int | None = None) -> GenerateRequest:
    """The engine's generate request for the sampling part of a chat request."""
    fields: dict[str, Any] = {
        "messages": messages or [],
        "expected_version": expected_version,
        "max_tokens": request.effective_max_tokens,
        "temperature": DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": request.top_k or 0,
        "seed": request.seed,
        "stop": stop_strings(request) or None,
        "logprobs": bool(request.logprobs),
        "top_logprobs": (request.top_logprobs or 0) if request.logprobs else 0,
        "min_tokens": request.min_tokens or 0,
    }
    return GenerateRequest.model_validate(fields)
