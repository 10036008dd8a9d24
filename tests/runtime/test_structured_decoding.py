"""Constrained decoding on the real default model, with tools and schemas it has never seen.

Validity is judged by ``jsonschema_rs`` (not by the grammar library that enforces it),
over many seeds at temperature 1, where an unconstrained small model goes astray.
"""

from __future__ import annotations

import json

import torch

import jsonschema_rs
import pytest
from starlette.testclient import TestClient
from server_support import make_runtime, sse_events, torch_threads, user

from leyline_runtime.text import chat_template as tpl
from leyline_runtime import create_app
from leyline_runtime.engine.grammar import GrammarCompiler

SEEDS = range(32)

# Names and schemas nowhere in the training data.
UNSEEN_TOOLS = [
    {"type": "function", "function": {"name": "book_flight", "description": "Book a flight", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["origin", "destination", "seats"],
        "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                       "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                       "seats": {"type": "integer", "minimum": 1, "maximum": 9}}}}},
    {"type": "function", "function": {"name": "set_thermostat", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["celsius", "room"],
        "properties": {"celsius": {"type": "number", "minimum": 5, "maximum": 30},
                       "room": {"enum": ["kitchen", "attic", "garage"]}}}}},
    {"type": "function", "function": {"name": "tag_photo", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["labels"],
        "properties": {"labels": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                  "minItems": 1, "maxItems": 3}}}}},
]
VALIDATORS = {t["function"]["name"]: jsonschema_rs.validator_for(t["function"]["parameters"]) for t in UNSEEN_TOOLS}
PROMPTS = ["Fly me from Oslo to Rome, two seats.", "It is cold upstairs.", "Describe this picture of a cat.",
           "hello there"]


@pytest.fixture(scope="module")
def client():
    with torch_threads(1), TestClient(create_app(runtime=make_runtime())) as c:
        yield c


def complete(client, **fields) -> dict:
    body = {"max_tokens": 96, "temperature": 1.0, **fields}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_required_always_calls_an_offered_tool_with_valid_arguments(client):
    for seed in SEEDS:
        out = complete(client, messages=[user(PROMPTS[seed % len(PROMPTS)])], tools=UNSEEN_TOOLS,
                       tool_choice="required", seed=seed)
        choice = out["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and calls, (seed, choice)
        for call in calls:
            name = call["function"]["name"]
            assert name in VALIDATORS, (seed, name)
            VALIDATORS[name].validate(json.loads(call["function"]["arguments"]))
        assert "<|" not in (choice["message"]["content"] or "")


def test_without_tools_no_tool_call_and_no_markup(client):
    for seed in SEEDS:
        # the prompt invites a call: the model was trained to call tools on requests like this
        out = complete(client, messages=[user("Use the calculator: what is 17 * 23?")], seed=seed, max_tokens=40)
        message = out["choices"][0]["message"]
        assert message["tool_calls"] is None and out["choices"][0]["finish_reason"] in ("stop", "length")
        assert "<|" not in message["content"], (seed, message["content"])


def test_auto_calls_only_offered_tools(client):
    for seed in range(8):
        out = complete(client, messages=[user("Use the calculator: what is 17 * 23?")], tools=UNSEEN_TOOLS,
                       seed=seed)
        for call in out["choices"][0]["message"]["tool_calls"] or []:
            VALIDATORS[call["function"]["name"]].validate(json.loads(call["function"]["arguments"]))
        assert "<|" not in (out["choices"][0]["message"]["content"] or "")


def test_json_schema_response_format(client):
    schema = {"type": "object", "additionalProperties": False, "required": ["answer", "confidence"],
              "properties": {"answer": {"type": "string", "maxLength": 30},
                             "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}
    validator = jsonschema_rs.validator_for(schema)
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    for seed in range(8):
        out = complete(client, messages=[user("what is the capital of France?")], response_format=fmt, seed=seed)
        validator.validate(json.loads(out["choices"][0]["message"]["content"]))


def test_streamed_constrained_reply_matches(client):
    body = {"messages": [user(PROMPTS[0])], "tools": UNSEEN_TOOLS, "tool_choice": "required", "seed": 5,
            "max_tokens": 96, "temperature": 1.0}
    plain = client.post("/v1/chat/completions", json=body).json()
    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    streamed = [c for e in events if isinstance(e, dict) for c in e["choices"] if c["delta"].get("tool_calls")]
    names = [t["function"]["name"] for c in streamed for t in c["delta"]["tool_calls"]]
    assert names == [c["function"]["name"] for c in plain["choices"][0]["message"]["tool_calls"]]


def test_grammars_are_compiled_once_per_schema(client):
    compiler: GrammarCompiler = client.app.state.chat.grammars
    body = {"messages": [user("hi")], "tools": UNSEEN_TOOLS[:1], "tool_choice": "required", "max_tokens": 40}
    complete(client, **body)
    before = compiler.compilations
    for seed in range(3):
        complete(client, **body, seed=seed)
    assert compiler.compilations == before


def test_context_management_clears_old_tool_results_as_an_amortize_edit(client):
    msgs = [{"role": "system", "content": "You are a helpful agent."}]
    for i in range(5):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"n": {i}}}'}}
        msgs += [user(f"read part {i}"), {"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": f"part {i}: " + "lorem ipsum " * 30}]
    edits = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
                        "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": []}]}
    first = complete(client, messages=msgs, session_id="ctx-1", context_management=edits, max_tokens=4,
                     temperature=0)
    applied = first["context_management"]["applied_edits"]
    assert applied[0]["cleared_tool_uses"] == 3 and applied[0]["cleared_input_tokens"] > 100
    msgs += [first["choices"][0]["message"] | {"content": first["choices"][0]["message"]["content"] or ""}]
    call = {"id": "c5", "type": "function", "function": {"name": "read_file", "arguments": '{"n": 5}'}}
    msgs += [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c5", "content": "part 5: " + "lorem ipsum " * 30}]
    second = complete(client, messages=msgs, session_id="ctx-1", context_management=edits, max_tokens=4,
                      temperature=0)
    report = second["leyline"]
    # the keep window moved by one: one more result cleared in place, the cache behind it kept
    assert report["directives_applied"] == 1 and not report["rebuilt"]
    assert report["outcomes"][0]["applied_mode"] == "amortize" and report["outcomes"][0]["rotated_tokens"] > 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > second["usage"]["prompt_tokens"] // 2
    assert second["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 4
    excluded = {"edits": [{**edits["edits"][0], "exclude_tools": ["read_file"]}]}
    assert complete(client, messages=msgs, context_management=excluded, max_tokens=2).get("context_management") is None


def test_parse_on_token_ids(client):
    tok = client.app.state.runtime.tokenizer
    call = '{"name": "f", "arguments": {"x": 1}}'
    ids = tok.encode("before ") + [tok.tool_call_id] + tok.encode(call) + [tok.end_tool_call_id] + tok.encode("!")
    parsed = tpl.parse_assistant_tokens(ids, tok.decode, tok.tool_call_id, tok.end_tool_call_id)
    assert parsed.content == "before !" and parsed.tool_calls[0].function.name == "f" and not parsed.malformed
    # text that only spells the markup is content; an unterminated call never reaches content
    spelled = tok.encode("a <|tool") + tok.encode("_call|> b")
    assert tpl.parse_assistant_tokens(spelled, tok.decode, tok.tool_call_id, tok.end_tool_call_id).tool_calls == []
    cut = tok.encode("x") + [tok.tool_call_id] + tok.encode('{"name": "f", "argu')
    parsed = tpl.parse_assistant_tokens(cut, tok.decode, tok.tool_call_id, tok.end_tool_call_id)
    assert parsed.content == "x" and parsed.malformed and not parsed.tool_calls
    stopped = tpl.parse_assistant_tokens(tok.encode("one two STOP three"), tok.decode, tok.tool_call_id,
                                         tok.end_tool_call_id, stop="STOP")
    assert stopped.content == "one two "


# Free strings without a length limit: a small model at temperature 1 rarely closes them by itself.
JOKE = {"type": "object", "required": ["setup", "punchline"], "title": "Joke",
        "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"},
                       "tags": {"type": "array", "items": {"type": "string"}}}}
JOKE_TOOL = {"type": "function", "function": {"name": "joke", "parameters": JOKE}}


def budget_replies(client, budget: int, seeds: range) -> list[tuple[str, dict]]:
    """(finish_reason, the JSON text of the reply) for a json_schema reply and a required call per seed."""
    fmt = {"type": "json_schema", "json_schema": {"name": "joke", "schema": JOKE}}
    out = []
    for seed in seeds:
        for extra in ({"response_format": fmt}, {"tools": [JOKE_TOOL], "tool_choice": "required"}):
            choice = complete(client, messages=[user("Tell me a joke about cats.")], max_tokens=budget,
                              seed=seed, **extra)["choices"][0]
            calls = choice["message"]["tool_calls"] or []
            out.append((choice["finish_reason"], calls[0]["function"]["arguments"] if calls
                        else choice["message"]["content"] or ""))
    return out


@pytest.mark.slow  # many constrained replies (~23 s on 2 cores): make test-slow
def test_structured_replies_are_closed_before_the_budget_ends(client):
    validator = jsonschema_rs.validator_for(JOKE)
    for budget in (40, 64):
        replies = budget_replies(client, budget, range(6))
        for finish, text in replies:
            validator.validate(json.loads(text))  # parses and matches, however the budget ended
            assert finish in ("stop", "tool_calls", "length")
        assert any(finish == "length" for finish, _ in replies)  # the budget did run out: closed, not cut


@pytest.mark.slow  # the pair of the test above: make test-slow
def test_without_closing_the_same_replies_are_cut(client, monkeypatch):
    """Negative control: the grammar without the budget leaves half a JSON value."""
    original = GrammarCompiler.processor
    monkeypatch.setattr(GrammarCompiler, "processor", lambda self, grammar, max_tokens=None: original(self, grammar))
    broken = 0
    for _, text in budget_replies(client, 40, range(6)):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            broken += 1
    assert broken > 0


def test_evaluate_constrained_decodes_with_the_grammar(capsys):
    """``leyline-train evaluate --constrained``: every attempted call is well-formed (by construction)."""
    from leyline_training.evaluate import main

    with torch_threads(1):
        result = main(["--tasks", "2", "--ppl-transcripts", "0", "--max-turns", "3", "--max-tokens", "48",
                       "--constrained"])
    agent = result["agent"]
    assert result["constrained"] is True and agent["tool_calls_attempted"] > 0
    assert agent["tool_calls_well_formed"] == agent["tool_calls_attempted"]


@pytest.mark.parametrize("left", [1, 3, 8])
def test_free_text_near_the_budget_is_not_closed(left):
    """With tools offered, a text reply may stop anywhere: the last tokens of its budget stay free
    (closing once forced ']' and '}' into plain answers: '12 * 7 + 5]]]]}')."""
    from leyline_runtime.model.default import default_tokenizer_path
    from leyline_runtime.server.constraints import request_grammar
    from leyline_runtime.api.chat_request import DecodingFields
    from leyline_runtime.text.tokenizer import ChatTokenizer

    tok = ChatTokenizer.from_file(default_tokenizer_path())
    grammar = request_grammar(DecodingFields(tools=UNSEEN_TOOLS, tool_choice="auto"))
    text = tok.encode("12 * 7 + 5")
    processor = GrammarCompiler(tok).processor(grammar, max_tokens=len(text) + left)
    generated: list[int] = []
    for token in text:
        processor(torch.zeros(tok.vocab_size), generated)
        processor.accept(token)
        generated.append(token)
    allowed = torch.isfinite(processor(torch.zeros(tok.vocab_size), generated))
    assert not processor.closing
    assert allowed[tok.encode(" =")[0]] and allowed[tok.end_id] and allowed.sum() > 1000
