"""Every request field the ``openai`` client knows: it works here, or it is a clean 400 naming it.

The field list comes from the installed client (``CompletionCreateParamsBase``), so
a field added to the client fails this test until it is implemented or rejected.
The client talks to the real app in process (Starlette's TestClient is an httpx
client); penalties and ``logit_bias`` are checked exactly against the model's own
logprobs: at temperature 0 the chosen token must be the argmax of the adjusted scores.
"""

from __future__ import annotations

import collections

import openai
import pytest
from openai.types.chat import completion_create_params
from starlette.testclient import TestClient
from server_support import default_model_and_tokenizer, make_runtime, torch_threads, user

from leyline_runtime import create_app

MODEL = "leyline-default"
PROMPT = [user("count the numbers: 1 2 3 4 5")]

IMPLEMENTED = {"messages", "model", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
               "top_logprobs", "max_tokens", "max_completion_tokens", "n", "parallel_tool_calls",
               "response_format", "seed", "stop", "stream_options", "temperature", "tool_choice", "tools",
               "top_p", "store"}
NO_OPS = {"user", "metadata", "prompt_cache_key", "safety_identifier"}
REJECTED = {  # field -> a value a caller could send
    "audio": {"voice": "alloy", "format": "wav"}, "function_call": "auto",
    "functions": [{"name": "f", "parameters": {"type": "object"}}], "modalities": ["text"],
    "moderation": {"type": "auto"}, "prediction": {"type": "content", "content": "x"},
    "prompt_cache_options": {"mode": "auto"}, "prompt_cache_retention": "24h", "reasoning_effort": "low",
    "service_tier": "auto", "verbosity": "low", "web_search_options": {},
}


@pytest.fixture(scope="module")
def client():
    with torch_threads(1), TestClient(create_app(runtime=make_runtime())) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


def create(client, **fields):
    fields.setdefault("messages", PROMPT)
    fields.setdefault("max_tokens", 8)
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, **fields)


def test_every_client_field_is_classified():
    known = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert known == IMPLEMENTED | NO_OPS | set(REJECTED), known ^ (IMPLEMENTED | NO_OPS | set(REJECTED))


@pytest.mark.parametrize("field", sorted(REJECTED))
def test_unsupported_fields_are_400_naming_the_field(client, field):
    with pytest.raises(openai.BadRequestError) as err:
        create(client, extra_body={field: REJECTED[field]})
    body = err.value.body
    assert body["param"] == field and field in body["message"] and body["type"] == "invalid_request_error"


@pytest.mark.parametrize("fields,param", [
    ({"n": 2}, "n"), ({"store": True}, "store"), ({"temperature": 3}, "temperature"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"response_format": {"type": "xml"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
     "tools[0].function.parameters"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
])
def test_invalid_values_are_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        create(client, **fields)
    assert err.value.body["param"] == param, err.value.body


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=2)
    assert err.value.body["code"] == "model_not_found"


def test_no_op_fields_change_nothing(client):
    plain = create(client).choices[0].message.content
    noted = create(client, user="u-1", metadata={"k": "v"}, prompt_cache_key="k", safety_identifier="s",
                   store=False, n=1)
    assert noted.choices[0].message.content == plain


def _chosen_is_argmax(completion, adjust) -> None:
    """At temperature 0 each token must be the argmax of ``adjust(token, logprob, counts)``."""
    counts: collections.Counter[str] = collections.Counter()
    for entry in completion.choices[0].logprobs.content:
        tops = [t for t in entry.top_logprobs if t.token == "<|end|>" or not t.token.startswith("<|")]
        best = max(tops, key=lambda t: adjust(t.token, t.logprob, counts))
        assert adjust(entry.token, entry.logprob, counts) == pytest.approx(adjust(best.token, best.logprob, counts))
        counts[entry.token] += 1


def test_penalties_are_applied_exactly(client):
    freq, pres = 1.5, 0.7
    out = create(client, frequency_penalty=freq, presence_penalty=pres, logprobs=True, top_logprobs=20,
                 max_tokens=16)
    _chosen_is_argmax(out, lambda tok, lp, counts: lp - freq * counts[tok] - pres * (counts[tok] > 0))
    plain = create(client, logprobs=True, top_logprobs=20, max_tokens=16)
    _chosen_is_argmax(plain, lambda tok, lp, counts: lp)


def test_logit_bias_forces_and_forbids(client):
    plain = create(client, logprobs=True, top_logprobs=1, max_tokens=4)
    first = plain.choices[0].logprobs.content[0].token
    tid = default_model_and_tokenizer()[1].encode(first)[0]
    banned = create(client, logit_bias={str(tid): -100}, logprobs=True, max_tokens=4)
    assert banned.choices[0].logprobs.content[0].token != first
    x_id = default_model_and_tokenizer()[1].encode(" x")[0]
    forced = create(client, logit_bias={str(x_id): 100}, max_tokens=4)
    assert forced.choices[0].message.content == " x" * 4


def test_sampling_fields(client):
    greedy = create(client, max_tokens=6).choices[0].message.content
    assert create(client, temperature=1.0, top_p=1e-6, max_tokens=6, seed=3).choices[0].message.content == greedy
    a = create(client, temperature=1.0, seed=11, max_tokens=12).choices[0].message.content
    assert create(client, temperature=1.0, seed=11, max_tokens=12).choices[0].message.content == a
    seeded = {create(client, temperature=1.0, seed=s, max_tokens=12).choices[0].message.content for s in range(4)}
    assert len(seeded) > 1
    short = create(client, max_completion_tokens=3, max_tokens=50)
    assert short.usage.completion_tokens <= 3
    lp = create(client, logprobs=True, top_logprobs=2, max_tokens=3).choices[0].logprobs.content
    assert all(len(e.top_logprobs) == 2 for e in lp)


def test_stop_cuts_the_content(client):
    text = create(client, max_tokens=12).choices[0].message.content
    stop = text.strip().split()[1] if len(text.split()) > 1 else text.strip()[:2]
    cut = create(client, max_tokens=12, stop=[stop])
    assert stop not in cut.choices[0].message.content and cut.choices[0].finish_reason == "stop"
    assert text.startswith(cut.choices[0].message.content)


def test_stream_options(client):
    chunks = list(create(client, stream=True, stream_options={"include_usage": True}, max_tokens=4))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 4


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "world_clock", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def test_tool_fields(client):
    ask = [user("what is the weather in Paris and the time in CET?")]
    named = create(client, messages=ask, tools=[WEATHER, CLOCK], max_tokens=60,
                   tool_choice={"type": "function", "function": {"name": "world_clock"}})
    calls = named.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["world_clock"] and named.choices[0].finish_reason == "tool_calls"
    single = create(client, messages=ask, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False,
                    max_tokens=60)
    assert len(single.choices[0].message.tool_calls) == 1
    none = create(client, messages=ask, tools=[WEATHER, CLOCK], tool_choice="none", max_tokens=20)
    assert none.choices[0].message.tool_calls is None and "<|" not in none.choices[0].message.content


def test_parse_with_a_pydantic_response_format(client):
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        # bounded: the grammar closes the string by 40 characters; a 12.8M model may not on its own
        city: str = Field(max_length=40)
        sunny: bool

    out = client.chat.completions.parse(model=MODEL, messages=[user("weather in Oslo?")],
                                        response_format=Answer, max_tokens=120, temperature=0)
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, Answer)
    obj = create(client, response_format={"type": "json_object"}, max_tokens=40)
    assert obj.choices[0].message.content.startswith("{")
