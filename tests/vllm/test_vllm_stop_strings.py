"""A session turn that ends on a stop string, checked against vLLM's own count of what it computed.

vLLM's frontend, not its engine, finds stop strings: it hands back the final output at once and aborts
the request in the engine, so that output carries no connector report. Before this was handled, such a
turn reported every prompt token as computed (``cached_tokens`` 0), and its rows were not held, so the
session's next request silently recomputed its whole prompt (seen on an AMX Xeon with the real
Qwen2.5-Coder-0.5B, in 3 of 9 session requests of the replay below).

The replay, per mode (amortize, auto, forget): a session is created; edited through a bound chat that
stops on a stop string; a plain request and a salted plain request run on the edited history; the
session generates again; it is deleted. Every session request's computed tokens must equal what vLLM's
``vllm:prompt_tokens_by_source{source="local_compute"}`` counter grew by, and the turn after the stop
must find the stopped turn's rows held.
"""

from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest

from leyline_testkit.vllm_server import SERVED_MODEL_NAME
from leyline_bench.vllm.checks import REPLACEMENT, edited, history
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Message

# Common characters (at most 4, as OpenAI allows): the tiny random model's greedy text holds one soon.
STOP = [" ", "e", "a", "o"]
MAX_TOKENS = 160
COMPUTED = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="local_compute"[^}]*\} (\S+)$', re.M)


@pytest.fixture()
def client(base_url):
    with LeylineClient(base_url, timeout=600) as c:
        yield c


def vllm_computed(base_url: str) -> int:
    """vLLM's running count of prompt tokens it computed, read once it stops moving (the frontend logs a
    step's stats after handing out its outputs)."""
    last = None
    for _ in range(40):
        value = sum(float(v) for v in COMPUTED.findall(httpx.get(f"{base_url}/metrics", timeout=30).text))
        if value == last:
            return int(value)
        last = value
        time.sleep(0.25)
    raise AssertionError("vLLM's local_compute counter did not settle")


def chat(base_url: str, body: dict) -> dict:
    r = httpx.post(f"{base_url}/v1/chat/completions", json={"model": SERVED_MODEL_NAME, "temperature": 0, **body},
                   timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def wire(messages: list[Message]) -> list[dict]:
    return [m.model_dump(exclude_none=True) for m in messages]


@pytest.mark.parametrize("mode", ["amortize", "auto", "forget"])
def test_a_turn_stopped_by_a_stop_string_is_counted_and_held(client, base_url, block, mode):
    old = history(tag=uuid.uuid4().hex[:12])  # this test's own text: nothing another test computed
    s = f"stop-{mode}-{uuid.uuid4().hex[:8]}"

    before = vllm_computed(base_url)
    info = client.create_session(old, session_id=s)
    assert vllm_computed(base_url) - before == info.counters.prefilled_tokens

    asked = edited(old, 3, REPLACEMENT) + [Message(role="user", content="Now the bread, in one line.")]
    before = vllm_computed(base_url)
    reply = chat(base_url, {"messages": wire(asked), "max_tokens": MAX_TOKENS, "stop": STOP, "session_id": s,
                            "leyline": {"mode": mode}})
    report, usage = reply["leyline"], reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "stop" and usage["completion_tokens"] < MAX_TOKENS, reply
    (outcome,) = report["outcomes"]
    assert outcome["fallback_reason"] is None, outcome
    # prefilled_tokens: every prompt token this request computed (the edit's recomputed ones included)
    assert vllm_computed(base_url) - before == report["prefilled_tokens"], (report, usage)
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - report["prefilled_tokens"]
    assert outcome["reused_tokens"] > 0, outcome  # the prefix before the edit came from the held rows

    answered = asked + [Message(role="assistant", content=reply["choices"][0]["message"]["content"])]
    chat(base_url, {"messages": wire(answered), "max_tokens": 1})
    chat(base_url, {"messages": wire(answered), "max_tokens": 1, "cache_salt": uuid.uuid4().hex})

    before = vllm_computed(base_url)
    after = client.generate(s, max_tokens=4, temperature=0)
    assert vllm_computed(base_url) - before == after.usage.prefill_tokens
    # the stopped turn's rows were held: at most its last block and the new tokens are computed
    assert after.usage.cached_tokens >= usage["prompt_tokens"] - block, (after.usage, usage)
    client.delete_session(s)
