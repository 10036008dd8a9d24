"""Schemathesis hooks for the contract run (``SCHEMATHESIS_HOOKS=schemathesis_hooks``).

Some rules of the API compare one field with another, which a JSON schema cannot state; the document
says them in words (``leyline_runtime/api/openapi.py``) and the server answers 422 naming them. The
generator is told them here, so that a body it calls valid is one the rules allow:

* a span's ``end`` is at or after its ``start``;
* a ``tool_choice`` that names a function names one of ``tools``, and ``required`` needs tools;
* no two ``tools`` share a name;
* on the Messages API: a ``tool_choice`` of type ``tool`` names one of ``tools``, ``any`` needs tools, and
  ``tool_use`` blocks sit only in assistant messages, ``tool_result`` blocks only in user ones;
* ``min_tokens`` is at most the reply's token cap (``max_completion_tokens``, ``max_tokens``, or the
  chat route's default when neither is sent).

And one the document cannot know: ``logit_bias`` keys are token ids of the served model's vocabulary
(the document says decimal ids; ids at or past the vocabulary are a 400 naming its size). The
generator keeps them under 256, inside any model's vocabulary.

A directive's span must also lie inside the session's current messages or text (422 ``invalid_span``,
``overlapping_spans``, ``invalid_directive``): an answer about the session's state, as a 404 is, which
no schema of the request can state; the contract test's configuration counts it as such for
``/directives`` only.
"""

from __future__ import annotations

from typing import Any

import schemathesis

from leyline_runtime.api.chat_request import DEFAULT_MAX_TOKENS
from leyline_runtime.config import RuntimeConfig


def _spans_ordered(body: dict) -> bool:
    for directive in body.get("directives") or []:
        span = directive.get("span") if isinstance(directive, dict) else None
        if isinstance(span, dict):
            start, end = span.get("start"), span.get("end")
            if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end < start:
                return False
    return True


def _tool_name(tool: Any) -> Any:
    """A tool's name: OpenAI's ``function.name``, or Anthropic's ``name``."""
    if not isinstance(tool, dict):
        return None
    return tool["function"].get("name") if isinstance(tool.get("function"), dict) else tool.get("name")


def _anthropic_choice_among_tools(choice: dict, body: dict) -> bool:
    names = [_tool_name(t) for t in body.get("tools") or []]
    if choice.get("type") == "any":
        return bool(names)
    return choice.get("type") != "tool" or choice.get("name") in names


def _blocks_fit_roles(body: dict) -> bool:
    """Anthropic's messages: ``tool_use`` blocks only in assistant messages, ``tool_result`` only in user ones."""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            misplaced = "tool_result" if message.get("role") == "assistant" else "tool_use"
            if any(isinstance(b, dict) and b.get("type") == misplaced for b in message["content"]):
                return False
    return True


def _choice_among_tools(body: dict) -> bool:
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and "function" not in choice:
        return _anthropic_choice_among_tools(choice, body)
    if choice == "required":  # a tool call is required: there must be tools to call
        return bool(body.get("tools"))
    if not isinstance(choice, dict):
        return True
    name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
    if name is None:
        return True
    tools = body.get("tools") or []
    return any(isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
               for t in tools)


def _tool_names_unique(body: dict) -> bool:
    names = [_tool_name(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    return len(names) == len(set(map(str, names)))


def _number(value: Any) -> bool:
    # the generator writes an integer field as 227.0 too, and the server takes it as 227
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _min_within_max(body: dict) -> bool:
    least = body.get("min_tokens")
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    return not (_number(least) and _number(cap) and least > cap)


def _bias_inside_any_vocabulary(body: dict) -> bool:
    bias = body.get("logit_bias")
    return not isinstance(bias, dict) or all(not k.isdigit() or int(k) < 256 for k in bias)


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    """On the Messages API ``model`` is required, and any other than the served one is a 404: the generator's
    model names become the served model's, so its bodies reach the route (a name the schema forbids stays)."""
    operation = getattr(context, "operation", None)
    model = body.get("model") if isinstance(body, dict) else None
    if operation is not None and operation.path.startswith("/v1/messages") and isinstance(model, str) \
            and 1 <= len(model) <= 256:
        return {**body, "model": RuntimeConfig().model_name}
    return body


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """A case-level filter: it also applies to the stateful phase's requests."""
    body = case.body
    if not isinstance(body, dict):
        return True
    return (_spans_ordered(body) and _choice_among_tools(body) and _tool_names_unique(body)
            and _min_within_max(body) and _bias_inside_any_vocabulary(body) and _blocks_fit_roles(body))
