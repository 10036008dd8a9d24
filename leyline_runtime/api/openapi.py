"""The OpenAPI document, made to say what the validators check.

The protocol's models keep some rules in validators, where pydantic's schema does not
show them: which role carries ``tool_calls`` or ``tool_call_id``, that a span ends at
or after its start, what the native generate route accepts as ``tools``. A client
(or schemathesis) reading the bare schema sends requests that are then refused. The
document FastAPI builds is amended here, once, from the same models:

- ``Message`` is one branch per role (``tool_calls`` only on assistant messages,
  ``tool_call_id`` only on tool messages, ``content`` null only beside tool calls);
- ``Directive`` is one branch per span unit (messages for a message span; text or
  token ids, never negative, for a token span);
- ``GenerateRequest``'s decoding fields take the shapes the chat route declares;
- ``logit_bias`` keys are decimal token ids and its biases within [-100, 100];
- ``top_logprobs`` needs ``logprobs: true`` and ``stream_options`` needs ``stream: true``;
- every integer without a bound is bounded to JSON's exact range (2^53 - 1), which
  also fits 64 bits (the request models refuse beyond it: ``leyline_sdk.json_numbers``);
- ``Span`` says in words that ``end >= start``: a schema cannot compare two fields.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from leyline_sdk.json_numbers import JSON_SAFE_INT

from ..api.chat_request import NEEDS_SWITCH, TOKEN_ID_KEY_PATTERN, DecodingFields

_NOTHING = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


def _role_branches() -> list[dict[str, Any]]:
    no_calls = {"tool_calls": _NOTHING}
    no_call_id = {"tool_call_id": {"type": "null"}}
    text = {"content": {"type": "string"}}
    # null content only beside tool calls (OpenAI's rule for an assistant message that calls tools)
    calls_or_text = {"anyOf": [{"properties": text},
                               {"required": ["tool_calls"], "properties": {
                                   "content": {"type": "null"},
                                   "tool_calls": {"type": "array", "minItems": 1}}}]}
    return [
        {"properties": {"role": {"enum": ["system", "user"]}, **no_calls, **no_call_id, **text}},
        {"properties": {"role": {"const": "assistant"}, **no_call_id}, **calls_or_text},
        {"properties": {"role": {"const": "tool"}, **no_calls, **text}},
    ]


def _unit_branches() -> list[dict[str, Any]]:
    messages = {"type": "array", "items": {"$ref": "#/components/schemas/Message"}}
    token_ids = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    return [
        {"properties": {"span": {"properties": {"unit": {"const": "message"}}}, "replacement": messages}},
        {"properties": {"span": {"required": ["unit"], "properties": {"unit": {"const": "token"}}},
                        "replacement": {"anyOf": [{"type": "string"}, token_ids]}}},
    ]


def _switch_rules() -> list[dict[str, Any]]:
    return [{"anyOf": [{"properties": {field: {"type": "null"}}},
                       {"required": [switch], "properties": {switch: {"const": True}}}]}
            for field, switch in NEEDS_SWITCH.items()]


def _bound_integers(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "integer":
            if "maximum" not in node and "exclusiveMaximum" not in node:
                node["maximum"] = JSON_SAFE_INT
            if "minimum" not in node and "exclusiveMinimum" not in node:
                node["minimum"] = -JSON_SAFE_INT
        for value in node.values():
            _bound_integers(value)
    elif isinstance(node, list):
        for value in node:
            _bound_integers(value)


def amend(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document) with the validators' rules written into it."""
    models = schema["components"]["schemas"]
    models["Message"]["oneOf"] = _role_branches()
    models["Message"]["properties"]["content"] = {"anyOf": [{"type": "string"}, {"type": "null"}],
                                                  "title": "Content", "default": ""}
    models["Message"]["description"] += " Only assistant messages carry `tool_calls`; only tool messages " \
                                        "carry `tool_call_id`."
    models["Directive"]["anyOf"] = _unit_branches()
    models["ChatCompletionRequest"]["allOf"] = _switch_rules()
    models["Span"]["description"] += " `end` is at or after `start`."
    models["ChatCompletionRequest"]["properties"]["logit_bias"] = {
        "anyOf": [{"type": "object", "maxProperties": 1024, "propertyNames": {"pattern": TOKEN_ID_KEY_PATTERN},
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}, {"type": "null"}],
        "default": None, "title": "Logit Bias",
        "description": "token id (decimal, of the served model's vocabulary) -> bias in [-100, 100]"}
    chat, generate = models["ChatCompletionRequest"]["properties"], models["GenerateRequest"]["properties"]
    for field in DecodingFields.model_fields:
        if field in generate and field in chat:
            generate[field] = {**chat[field], "title": generate[field].get("title", field)}
    _bound_integers(schema)
    return schema


def install_openapi(app: FastAPI) -> None:
    """``app.openapi()`` returns the amended document (built once, as FastAPI's own is)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = amend(get_openapi(title=app.title, version=app.version,
                                                   description=app.description, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
