"""The OpenAPI document, made to say what the validators check (on both engines).

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

On ``vllm serve`` the document is vLLM's, with the plugin's routes in it: only the models those
routes reach are amended, found under the names FastAPI gives them there (a class whose name
another model of vLLM's document also has is keyed by its module path,
``leyline_sdk__protocol__Message``), and a rule about a model vLLM's routes do not document (the
chat request there is vLLM's own) is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from leyline_sdk.json_numbers import JSON_SAFE_INT

from .chat_request import NEEDS_SWITCH, TOKEN_ID_KEY_PATTERN, DecodingFields

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


def _unit_branches(message_ref: str) -> list[dict[str, Any]]:
    messages = {"type": "array", "items": {"$ref": message_ref}}
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


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        return ([ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else []) + \
            [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def _reachable(schema: dict[str, Any], paths: list[str]) -> tuple[dict[str, str], set[str]]:
    """The models ``paths`` reach: the request-side ones by class name -> their key, and every key."""
    models = schema["components"]["schemas"]
    todo = _refs([schema["paths"][p] for p in paths if p in schema["paths"]])
    seen: set[str] = set()
    while todo:
        key = todo.pop()
        if key not in seen and key in models:
            seen.add(key)
            todo += _refs(models[key])
    names: dict[str, str] = {}
    for key in sorted(seen):
        if not key.endswith("-Output"):  # FastAPI's name for a model's response-side schema
            names[key.removesuffix("-Input").rsplit("__", 1)[-1]] = key
    return names, seen


def amend(schema: dict[str, Any], paths: list[str] | None = None) -> dict[str, Any]:
    """``schema`` (FastAPI's document) with the validators' rules written into the models that ``paths``
    (default: every path) reach."""
    paths = list(schema["paths"]) if paths is None else paths
    keys, reached = _reachable(schema, paths)
    models = {name: schema["components"]["schemas"][key] for name, key in keys.items()}
    message = f"#/components/schemas/{keys.get('Message', 'Message')}"
    if "Message" in models:
        models["Message"]["oneOf"] = _role_branches()
        models["Message"]["properties"]["content"] = {"anyOf": [{"type": "string"}, {"type": "null"}],
                                                      "title": "Content", "default": ""}
        models["Message"]["description"] += " Only assistant messages carry `tool_calls`; only tool messages " \
                                            "carry `tool_call_id`."
    if "Directive" in models:
        models["Directive"]["anyOf"] = _unit_branches(message)
    if "Span" in models:
        models["Span"]["description"] += " `end` is at or after `start`."
    if "ChatCompletionRequest" in models:
        chat = models["ChatCompletionRequest"]
        chat["allOf"] = _switch_rules()
        chat["properties"]["logit_bias"] = {
            "anyOf": [{"type": "object", "maxProperties": 1024, "propertyNames": {"pattern": TOKEN_ID_KEY_PATTERN},
                       "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
                      {"type": "null"}],
            "default": None, "title": "Logit Bias",
            "description": "token id (decimal, of the served model's vocabulary) -> bias in [-100, 100]"}
        if "GenerateRequest" in models:
            generate = models["GenerateRequest"]["properties"]
            for field in DecodingFields.model_fields:
                if field in generate and field in chat["properties"]:
                    generate[field] = {**chat["properties"][field], "title": generate[field].get("title", field)}
    _bound_integers([schema["paths"][p] for p in paths if p in schema["paths"]])
    _bound_integers([schema["components"]["schemas"][key] for key in reached])
    return schema


def refuse_fields(schema: dict[str, Any], model: str, refused: dict[str, str]) -> None:
    """``model``'s ``refused`` fields (name -> why) declared as never sent: null only, the reason in words."""
    key = _reachable(schema, list(schema["paths"]))[0].get(model)
    if key is None:
        return
    properties = schema["components"]["schemas"][key]["properties"]
    for field, reason in refused.items():
        properties[field] = {"type": "null", "default": None, "title": field.title(), "description": reason}


def install_openapi(app: FastAPI, paths: list[str] | None = None,
                    then: Callable[[dict[str, Any]], None] | None = None) -> None:
    """``app.openapi()`` returns the document its own builder makes (FastAPI's, or vLLM's), amended once
    for the models ``paths`` reach (default: every path), and by ``then`` (what the server knows once it
    is up: the document is first built at the first request)."""
    build = app.openapi
    amended: dict[str, Any] | None = None

    def openapi() -> dict[str, Any]:
        nonlocal amended
        if amended is None:
            amended = amend(build(), paths)
            if then is not None:
                then(amended)
        return amended

    app.openapi = openapi  # type: ignore[method-assign]
