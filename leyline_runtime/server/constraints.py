"""What a chat request lets the model write, as logits processors.

* tools offered (``tool_choice`` auto / required / named): a grammar in which a
  call can only name an offered tool, with arguments valid against its schema;
  ``auto`` allows text before the calls, ``required`` and named allow calls only,
  ``parallel_tool_calls=false`` at most one call;
* ``response_format`` json_object / json_schema: the reply is one JSON value
  matching the schema (or a call, when tools are also offered);
* otherwise free text: every control token of the template but ``<|end|>`` is
  masked, so no tool call and no markup can be written;
* penalties and ``logit_bias`` apply before the grammar mask, so a bias can never
  let a forbidden token through.

The arguments are written exactly as the template renders calls
(``json.dumps`` separators), so a constrained reply looks like a trained one.
Tightenings keep replies short and still valid against the caller's schema:
numbers have at most six decimals (``multipleOf`` 1e-6 where a schema sets none),
integers without bounds stay within ±10^15, and an object that lists its ``properties`` gets no others unless the schema says
``additionalProperties`` itself. A small model sampling at temperature 1 then
cannot spend its whole budget on the digits of one number or on invented keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from leyline_sdk.errors import ValidationFailed
from leyline_sdk.protocol import GenerateRequest

from leyline_runtime.engine.grammar import GrammarCompiler, GrammarError, TokenMask
from leyline_runtime.engine.sampling import LogitBias, LogitsProcessor, Penalties
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..api.errors import describe_validation
from ..api.openai_errors import OpenAIError, invalid_request
from ..api.chat_request import TOKEN_ID_KEY_PATTERN, DecodingFields, NamedToolChoice, ResponseFormatJsonSchema, Tool

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
BIAS_LIMIT = 100.0
TOKEN_ID_KEY = re.compile(TOKEN_ID_KEY_PATTERN.strip("^$"))
NUMBER_STEP = 0.000001  # see the module docstring
INTEGER_LIMIT = 10**15


@dataclass
class Decoding:
    """A request's constraints, validated; :meth:`processors` makes fresh ones per generation."""

    grammar: str | None  # None: free text
    banned: set[int] = field(default_factory=set)
    bias: dict[int, float] = field(default_factory=dict)
    presence: float = 0.0
    frequency: float = 0.0

    def processors(self, compiler: GrammarCompiler, max_tokens: int | None = None) -> list[LogitsProcessor]:
        """``max_tokens``: the reply's budget, so that a structured reply is closed in time to parse."""
        out: list[LogitsProcessor] = []
        if self.presence or self.frequency:
            out.append(Penalties(self.presence, self.frequency))
        if self.bias:
            out.append(LogitBias(self.bias))
        if self.grammar is not None:
            out.append(compiler.processor(self.grammar, max_tokens))
        elif self.banned:
            out.append(TokenMask(self.banned))
        return out


def plan_decoding(request: DecodingFields, tokenizer: ChatTokenizer, compiler: GrammarCompiler) -> Decoding:
    """Check the request's constraints and compile its grammar; a 400 naming the field if they are bad."""
    check_tool_choice(request)
    grammar = request_grammar(request)
    if grammar is not None:
        _compile(grammar, request, compiler)
    return Decoding(
        grammar=grammar,
        banned=tokenizer.special_ids - {tokenizer.end_id},
        bias=_logit_bias(request, tokenizer.vocab_size),
        presence=request.presence_penalty, frequency=request.frequency_penalty)


def check_tool_choice(request: DecodingFields) -> None:
    names = [t.function.name for t in request.tools or []]
    if len(set(names)) != len(names):
        raise invalid_request("tools: two tools share a name", "tools")
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise invalid_request(f"tool_choice names {choice.function.name!r}, which is not in tools", "tool_choice")
    if choice == "required" and not names:
        raise invalid_request("tool_choice 'required' needs tools", "tool_choice")


def request_grammar(request: DecodingFields) -> str | None:
    """The Lark grammar for the reply, or None for free text."""
    content = _content_schema(request)
    tools = _callable_tools(request)
    if not tools:
        return None if content is None else f"start: json\n{_json_rule('json', content)}"
    choice = request.tool_choice
    named = isinstance(choice, NamedToolChoice)
    call = "call" if named or not request.parallel_tool_calls else "call+"
    if choice == "required" or named:
        start = call  # calls only
    elif content is None:
        start = f"TEXT? {call}?" if call == "call" else "TEXT? call*"  # text, then any calls
    else:
        start = f"json | {call}"  # a JSON reply, or calls
    rules = [f"start: {start}",
             "call: <|tool_call|> call_body <|end_tool_call|>",
             _json_rule("call_body", {"anyOf": [_call_schema(t) for t in tools]}),
             "TEXT: /(?s:.+)/"]
    if content is not None:
        rules.append(_json_rule("json", content))
    return "\n".join(rules) + "\n"


def _callable_tools(request: DecodingFields) -> list[Tool]:
    tools = list(request.tools or [])
    choice = request.tool_choice
    if choice == "none":
        return []
    if isinstance(choice, NamedToolChoice):
        return [t for t in tools if t.function.name == choice.function.name]
    return tools


def _content_schema(request: DecodingFields) -> dict[str, Any] | None:
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if isinstance(fmt, ResponseFormatJsonSchema):
        return fmt.json_schema.schema_ or ANY_OBJECT
    return ANY_OBJECT


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"const": tool.function.name},
                           "arguments": tool.function.parameters or ANY_OBJECT},
            "required": ["name", "arguments"], "additionalProperties": False}


def _json_rule(name: str, schema: dict[str, Any]) -> str:
    schema = _tightened(schema)
    # key order matters: properties are written in the order listed ("name" before "arguments")
    return f"{name}: %json{json.dumps({**schema, 'x-guidance': JSON_STYLE})}"


def _tightened(node: Any) -> Any:
    """``node`` with the two tightenings of the module docstring, at every level."""
    if isinstance(node, list):
        return [_tightened(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _tightened(v) for k, v in node.items()}
    types = out.get("type")
    if (types == "number" or isinstance(types, list) and "number" in types) and "multipleOf" not in out:
        out["multipleOf"] = NUMBER_STEP
    unbounded = not {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(out)
    if (types == "integer" or isinstance(types, list) and "integer" in types) and unbounded:
        out["minimum"], out["maximum"] = -INTEGER_LIMIT, INTEGER_LIMIT
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _compile(grammar: str, request: DecodingFields, compiler: GrammarCompiler) -> None:
    try:
        compiler.processor(grammar)
    except GrammarError as exc:
        raise invalid_request(f"cannot decode to this schema: {exc}", _culprit(request, compiler)) from exc


def _culprit(request: DecodingFields, compiler: GrammarCompiler) -> str:
    """The request field whose schema does not compile on its own."""
    for i, tool in enumerate(request.tools or []):
        try:
            compiler.processor(f"start: x\n{_json_rule('x', tool.function.parameters or ANY_OBJECT)}\n")
        except GrammarError:
            return f"tools[{i}].function.parameters"
    return "response_format"


def _logit_bias(request: DecodingFields, vocab_size: int) -> dict[int, float]:
    # keys as the document states them (TOKEN_ID_KEY_PATTERN): decimal token ids, no sign, spaces or leading 0
    bias: dict[int, float] = {}
    for key, value in (request.logit_bias or {}).items():
        if not TOKEN_ID_KEY.fullmatch(key) or int(key) >= vocab_size:
            raise invalid_request(f"logit_bias: {key!r} is not a token id (0..{vocab_size - 1})", "logit_bias")
        if not -BIAS_LIMIT <= value <= BIAS_LIMIT:
            raise invalid_request(f"logit_bias: {value} for token {key} is outside [-100, 100]", "logit_bias")
        bias[int(key)] = value
    return bias


def native_processors(body: GenerateRequest, tokenizer: ChatTokenizer,
                      compiler: GrammarCompiler) -> list[LogitsProcessor] | None:
    """Processors for the native generate route: None (free text) unless it names constraints."""
    if body.tools is None and body.tool_choice is None and body.response_format is None:
        return None
    fields = {"tools": body.tools, "tool_choice": body.tool_choice,
              "parallel_tool_calls": body.parallel_tool_calls, "response_format": body.response_format}
    try:
        decoding = plan_decoding(DecodingFields.model_validate(fields), tokenizer, compiler)
    except ValidationError as exc:
        raise ValidationFailed(describe_validation(exc.errors())) from exc
    except OpenAIError as exc:
        raise ValidationFailed(exc.message) from exc
    return decoding.processors(compiler, body.max_tokens)
