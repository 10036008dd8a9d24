"""The REST contract, defined once and run against every backend.

``tests/server/test_server_api.py`` runs it against the bundled runtime (in-process),
``tests/vllm/test_vllm_api_contract.py`` against ``vllm serve`` with Leyline's
plugin. Each check takes an HTTP client (``get``/``post``/``delete`` relative
to the server, JSON bodies) and asserts only what every backend promises: paths,
status codes, the error body, versions and message counts, each directive's
``applied_mode`` and ``fallback_reason`` (one rule for both engines:
``leyline_runtime/outcome_rule.py``) — never token counts, which depend on the
model's chat template.

The session routes come first, then ``POST /v1/chat/completions`` bound to a session:
the response's and the ``leyline`` report's fields, built and rebuilt and why, the
request's fields and limits (400s in OpenAI's shape naming the field), and every
field an engine may not honour: honoured where it is accepted, refused by name where
it is not, never both accepted and ignored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from leyline_sdk.protocol import MAX_DIRECTIVES, SESSION_HEADER

Client = Any  # starlette's TestClient or an httpx.Client with a base_url


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def history(n: int) -> list[dict]:
    out = [{"role": "system", "content": "You are terse."}]
    for k in range(n):
        out.append(user(f"question {k}") if k % 2 == 0 else {"role": "assistant", "content": f"answer {k}"})
    return out


def new_session(c: Client, messages: list[dict] | None = None) -> dict:
    r = c.post("/sessions", json={"session_id": f"c-{uuid.uuid4().hex[:12]}",
                                  "messages": messages if messages is not None else history(4)})
    assert r.status_code == 201, r.text
    return r.json()


def assert_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]


def snapshot(c: Client, sid: str) -> dict:
    r = c.get(f"/sessions/{sid}", params={"include_messages": "true"})
    assert r.status_code == 200, r.text
    return r.json()


def lifecycle(c: Client) -> None:
    info = new_session(c, history(2))
    sid = info["session_id"]
    assert info["version"] == 1 and info["num_messages"] == 3 and info["messages"] is None
    assert [s["role"] for s in info["segments"]] == ["system", "user", "assistant"]
    assert sid in [s["session_id"] for s in c.get("/sessions").json()["sessions"]]
    assert [m["content"] for m in snapshot(c, sid)["messages"]] == [m["content"] for m in history(2)]
    r = c.post(f"/sessions/{sid}/messages", json={"messages": [user("one more")], "expected_version": 1})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2 and r.json()["num_messages"] == 4
    r = c.post(f"/sessions/{sid}/generate", json={"messages": [user("go")], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    gen = r.json()
    assert gen["message"]["role"] == "assistant" and gen["usage"]["completion_tokens"] <= 2
    after = snapshot(c, sid)
    assert after["version"] == gen["version"] > 2 and after["num_messages"] == 6
    assert c.delete(f"/sessions/{sid}").status_code == 204
    assert_error(c.get(f"/sessions/{sid}"), 404, "session_not_found")


def a_directive_batch_edits_messages(c: Client) -> None:
    info = new_session(c, history(6))
    sid = info["session_id"]
    r = c.post("/directives", json={"session_id": sid, "expected_version": info["version"], "directives": [
        {"span": {"start": 2, "end": 3}},
        {"span": {"start": 4, "end": 5}, "replacement": [user("shorter")], "mode": "forget"}]})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["version"] == info["version"] + 1 and result["num_messages"] == 6
    assert [o["requested_mode"] for o in result["outcomes"]] == ["amortize", "forget"]
    assert snapshot(c, sid)["messages"][3]["content"] == "shorter"


def long_note(k: int) -> str:
    """A message long enough that the rows after an edit fill several cache blocks on every engine (vLLM
    moves no run shorter than a block)."""
    return f"Note {k}: " + " ".join(f"item {k}.{i} stays as it was written" for i in range(40))


def outcomes(result: dict) -> list[tuple[str, str | None]]:
    return [(o["applied_mode"], o["fallback_reason"]) for o in result["outcomes"]]


def outcomes_name_what_each_edit_was_applied_as(c: Client) -> None:
    """The same rule and words on every engine: an amortize before a forget keeps its mode (the rows
    between the two still move); one after a forget is recomputed with it (``after_forget``)."""
    old = [{"role": "system", "content": "You are terse."}, user("question 0"),
           {"role": "assistant", "content": long_note(1)}, user(long_note(2)),
           {"role": "assistant", "content": "answer 3"}, user("question 4")]
    shorter = [{"span": {"start": 1, "end": 2}, "replacement": [user("question zero")]},
               {"span": {"start": 4, "end": 5}, "replacement": [{"role": "assistant", "content": "a3"}]}]
    for modes, want in [(("amortize", "forget"), [("amortize", None), ("forget", None)]),
                        (("forget", "amortize"), [("forget", None), ("forget", "after_forget")])]:
        sid = new_session(c, old)["session_id"]
        r = c.post("/directives", json={"session_id": sid, "directives": [
            {**d, "mode": mode} for d, mode in zip(shorter, modes)]})
        assert r.status_code == 200, r.text
        assert [o["requested_mode"] for o in r.json()["outcomes"]] == list(modes), r.json()
        assert outcomes(r.json()) == want, r.json()


def erase_edits_are_recomputed_whatever_their_mode(c: Client) -> None:
    """``intent: "erase"`` (content that must stop influencing the model): the rows after it are recomputed,
    whatever mode was asked, reason ``erase``; an edit after it is recomputed with it (``after_forget``); one
    before it keeps its mode; the intent is echoed, a shrink's too (the default)."""
    old = [{"role": "system", "content": "You are terse."}, user("question 0"),
           {"role": "assistant", "content": long_note(1)}, user(long_note(2)),
           {"role": "assistant", "content": "answer 3"}, user("question 4")]
    edits = [{"span": {"start": 1, "end": 2}, "replacement": [user("question zero")]},
             {"span": {"start": 4, "end": 5}, "replacement": [{"role": "assistant", "content": "a3"}]}]
    for modes, intents, want in [
            (("amortize", "amortize"), ("erase", None), [("forget", "erase"), ("forget", "after_forget")]),
            (("amortize", "auto"), ("shrink", "erase"), [("amortize", None), ("forget", "erase")])]:
        sid = new_session(c, old)["session_id"]
        directives = [{**d, "mode": mode, **({"intent": intent} if intent else {})}
                      for d, mode, intent in zip(edits, modes, intents)]
        r = c.post("/directives", json={"session_id": sid, "directives": directives})
        assert r.status_code == 200, r.text
        got = r.json()["outcomes"]
        assert [o["requested_mode"] for o in got] == list(modes), got
        assert [o["intent"] for o in got] == [i or "shrink" for i in intents], got
        assert outcomes(r.json()) == want, got
        if modes[1] == "auto":  # the choice made for it, in the words of the rule
            assert got[1]["auto"]["choice"] == "forget" and got[1]["auto"]["reason"] == "erase", got
    bad = c.post("/directives", json={"session_id": sid, "directives": [{**edits[0], "intent": "hide"}]})
    assert_error(bad, 422, "validation_error")


def unknown_session_is_404_everywhere(c: Client) -> None:
    assert_error(c.get("/sessions/nope"), 404, "session_not_found")
    assert_error(c.delete("/sessions/nope"), 404, "session_not_found")
    assert_error(c.post("/sessions/nope/messages", json={"messages": [user("x")]}), 404, "session_not_found")
    assert_error(c.post("/sessions/nope/generate", json={"max_tokens": 1}), 404, "session_not_found")
    assert_error(c.post("/directives", json={"session_id": "nope", "directives": [{"span": {"start": 0, "end": 0}}]}),
                 404, "session_not_found")


def version_conflict_changes_nothing(c: Client) -> None:
    info = new_session(c)
    sid, before = info["session_id"], snapshot(c, info["session_id"])
    stale = info["version"] + 5
    assert_error(c.post("/directives", json={"session_id": sid, "expected_version": stale,
                                             "directives": [{"span": {"start": 1, "end": 2}}]}), 409, "version_conflict")
    assert_error(c.post(f"/sessions/{sid}/messages", json={"messages": [user("x")], "expected_version": stale}),
                 409, "version_conflict")
    assert_error(c.post(f"/sessions/{sid}/generate", json={"expected_version": stale, "max_tokens": 1}),
                 409, "version_conflict")
    assert snapshot(c, sid) == before


def bad_spans_change_nothing(c: Client) -> None:
    sid = new_session(c)["session_id"]
    before = snapshot(c, sid)
    for directives, code in [
        ([{"span": {"start": 1, "end": 3}}, {"span": {"start": 2, "end": 4}}], "overlapping_spans"),
        ([{"span": {"start": 2, "end": 2}, "replacement": [user("a")]},
          {"span": {"start": 2, "end": 2}, "replacement": [user("b")]}], "overlapping_spans"),
        ([{"span": {"start": 1, "end": 99}}], "invalid_span"),
    ]:
        assert_error(c.post("/directives", json={"session_id": sid, "directives": directives}), 422, code)
    assert snapshot(c, sid) == before


def invalid_bodies_are_422_and_unparseable_ones_400(c: Client) -> None:
    too_many = [{"span": {"start": 0, "end": 0}, "replacement": [user("x")]}] * (MAX_DIRECTIVES + 1)
    for method, path, body in [
        ("post", "/sessions", {"messages": [{"role": "wizard", "content": "x"}]}),
        ("post", "/sessions", {"messages": "not a list"}),
        ("post", "/sessions", {"session_id": "-starts-badly"}),
        ("post", "/directives", {"session_id": "x", "directives": []}),
        ("post", "/directives", {"session_id": "x", "directives": too_many}),
        ("post", "/directives", {"session_id": "x", "directives": [{"span": {"start": 3, "end": 1}}]}),
        ("post", "/sessions/x/generate", {"max_tokens": 0}),
        ("post", "/sessions/x/generate", {"temperature": -1}),
        ("post", "/sessions/x/generate", {"max_tokens": 4, "min_tokens": 5}),
        ("post", "/sessions/x/messages", {"messages": []}),
        ("get", "/sessions/" + "x" * 200, None),
        ("get", "/sessions/-bad", None),
    ]:
        r = c.get(path) if method == "get" else c.post(path, json=body)
        assert_error(r, 422, "validation_error")
    # a body that is not JSON, or none at all: 400 invalid_body on every body route, saying what is wrong
    for path in ("/sessions", "/sessions/x/messages", "/sessions/x/generate", "/directives"):
        for content in (b"{not json", b""):
            r = c.post(path, content=content, headers={"Content-Type": "application/json"})
            error = assert_error(r, 400, "invalid_body")
            assert error["message"].startswith("the body "), error


# --- POST /v1/chat/completions bound to a session ------------------------------------------------

COMPLETION_FIELDS = {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "leyline",
                     "context_management"}
REPORT_FIELDS = {"session_id", "version", "versions", "built", "rebuilt", "rebuild_reason", "directives_applied",
                 "outcomes", "appended_messages", "prefilled_tokens"}
OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}
ANY_PARAM = object()


def new_id() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def post_chat(c: Client, sid: str | None, messages: list[dict], headers: dict | None = None, **fields: Any):
    body = {"messages": messages, "max_tokens": 2, "temperature": 0, **fields}
    if sid is not None:
        body["session_id"] = sid
    return c.post("/v1/chat/completions", json=body, headers=headers)


def bound_chat(c: Client, sid: str, messages: list[dict], **fields: Any) -> dict:
    """A bound chat that must succeed: its response and report in the shape every engine answers."""
    return checked_chat(c, post_chat(c, sid, messages, **fields), sid)


def served_model(c: Client) -> str:
    return c.get("/v1/models").json()["data"][0]["id"]


def checked_chat(c: Client, r, sid: str) -> dict:
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == COMPLETION_FIELDS and body["object"] == "chat.completion", body
    assert body["id"].startswith("chatcmpl-") and body["model"] == served_model(c), body
    report = body["leyline"]
    assert set(report) == REPORT_FIELDS and report["session_id"] == sid, report
    # every version the turn produced, consecutive, the last one the session's
    assert report["versions"] and report["versions"][-1] == report["version"], report
    assert report["versions"] == list(range(report["versions"][0], report["version"] + 1)), report
    assert report["directives_applied"] == len(report["outcomes"]), report
    assert report["rebuilt"] == (report["rebuild_reason"] is not None), report
    usage = body["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == max(0, usage["prompt_tokens"] - report["prefilled_tokens"]), (usage, report)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return body


def reply_message(body: dict) -> dict:
    """The reply as the client sends it back in the next request's history."""
    message = body["choices"][0]["message"]
    out = {"role": "assistant", "content": message["content"] or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def assert_openai_error(r, status: int, param: Any = ANY_PARAM) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == OPENAI_ERROR_FIELDS, body
    assert body["error"]["message"] and body["error"]["type"], body
    if param is not ANY_PARAM:
        assert body["error"]["param"] == param, body
    return body["error"]


def built_rebuilt(report: dict) -> tuple[bool, bool, str | None]:
    return report["built"], report["rebuilt"], report["rebuild_reason"]


def a_bound_chat_builds_then_edits_its_session(c: Client) -> None:
    sid = new_id()
    asked = [{"role": "system", "content": "You are terse."}, user("question 0")]
    first = bound_chat(c, sid, asked)
    report = first["leyline"]
    assert built_rebuilt(report) == (True, False, None), report  # new: built, not rebuilt
    assert report["outcomes"] == [] and report["appended_messages"] == 2, report
    held = snapshot(c, sid)
    assert held["version"] == report["version"] and held["num_messages"] == 3
    assert [m["content"] for m in held["messages"][:2]] == [m["content"] for m in asked]

    asked = [*asked, reply_message(first), user("question 1")]  # append-only
    second = bound_chat(c, sid, asked)
    report2 = second["leyline"]
    assert built_rebuilt(report2) == (False, False, None), report2
    assert report2["outcomes"] == [] and report2["appended_messages"] == 1, report2
    assert report2["versions"][0] == report["version"] + 1, (report, report2)

    # one message replaced, bound by the header, every edit as forget: one directive
    edited = [asked[0], user("question zero, reworded"), *asked[2:], reply_message(second), user("question 2")]
    third = checked_chat(c, post_chat(c, None, edited, headers={SESSION_HEADER: sid}, leyline={"mode": "forget"}), sid)
    report3 = third["leyline"]
    assert built_rebuilt(report3) == (False, False, None), report3
    assert [o["requested_mode"] for o in report3["outcomes"]] == ["forget"], report3
    assert report3["appended_messages"] == 1 and report3["versions"][0] == report2["version"] + 1, report3
    held = snapshot(c, sid)
    assert held["version"] == report3["version"] and held["num_messages"] == len(edited) + 1
    assert [m["content"] for m in held["messages"][:-1]] == [m["content"] for m in edited]


def a_bound_chat_names_why_it_rebuilt(c: Client) -> None:
    """Built: this server did not hold the session. Rebuilt: it had existed (its history holds a reply
    this server never saw: ``unknown_session``)."""
    sid, asked = new_id(), history(3)
    report = bound_chat(c, sid, asked)["leyline"]
    assert built_rebuilt(report) == (True, True, "unknown_session"), report
    assert report["appended_messages"] == len(asked) and report["outcomes"] == [], report
    held = new_session(c, history(3))  # created natively: held here, so a chat edits it
    report = bound_chat(c, held["session_id"], [*history(3), user("one more")])["leyline"]
    assert built_rebuilt(report) == (False, False, None) and report["appended_messages"] == 1, report
    assert c.delete(f"/sessions/{held['session_id']}").status_code == 204
    report = bound_chat(c, held["session_id"], [*history(3), user("one more")])["leyline"]
    assert built_rebuilt(report) == (True, True, "unknown_session"), report


def a_bound_chat_validates_its_fields(c: Client) -> None:
    """Limits and validation are the same everywhere: a 400 in OpenAI's shape naming the field; the
    session is left as it was, and no session is made."""
    info = new_session(c)
    sid, before = info["session_id"], snapshot(c, info["session_id"])
    asked = [*history(4), user("x")]
    cases: list[tuple[dict, Any]] = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, ANY_PARAM),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 8193}, "max_tokens"),
        ({"max_completion_tokens": 8193}, "max_completion_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, ANY_PARAM),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 2}, "n"),
        ({"store": True}, "store"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # needs stream: true
        ({"leyline": {"mode": "sideways"}}, "leyline.mode"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]
    for fields, param in cases:
        assert_openai_error(post_chat(c, sid, **{"messages": asked, **fields}), 400, param)
    err = assert_openai_error(post_chat(c, sid, asked, model="no-such-model"), 404, "model")
    assert err["code"] == "model_not_found", err
    assert_openai_error(post_chat(c, "-bad", asked), 400, "session_id")
    assert_openai_error(post_chat(c, None, asked, headers={SESSION_HEADER: "-bad"}), 400, SESSION_HEADER)
    r = c.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json",
                                                                       SESSION_HEADER: sid})
    assert_openai_error(r, 400, None)
    assert snapshot(c, sid) == before
    assert "-bad" not in [s["session_id"] for s in c.get("/sessions").json()["sessions"]]


def a_bound_chat_honours_its_sampling_fields(c: Client) -> None:
    sid, asked = new_id(), [user("Count to ten: one, two,")]
    body = bound_chat(c, sid, asked, max_tokens=6, min_tokens=6)
    assert body["usage"]["completion_tokens"] == 6, body["usage"]  # the reply cannot end before min_tokens
    asked = [*asked, reply_message(body), user("Again.")]
    body = bound_chat(c, sid, asked, max_tokens=6, max_completion_tokens=2)
    assert body["usage"]["completion_tokens"] <= 2, body["usage"]  # max_completion_tokens wins
    asked = [*asked, reply_message(body), user("Again.")]
    body = bound_chat(c, sid, asked, logprobs=True, top_logprobs=2, stop=["a", "b", "c", "d"], top_k=5,
                      user="u-1", metadata={"k": "v"}, prompt_cache_key="k", safety_identifier="s", store=False,
                      n=1, model=served_model(c))
    content = body["choices"][0]["logprobs"]["content"]
    assert content and all(len(entry["top_logprobs"]) == 2 for entry in content), content


PING = {"type": "function", "function": {"name": "ping", "description": "Check that the line is up",
                                         "parameters": {"type": "object", "properties": {}}}}


def _streamed(r) -> None:
    assert r.headers["content-type"].startswith("text/event-stream") and r.text.rstrip().endswith("data: [DONE]")


def _json_reply(r) -> None:
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict), r.text


def _calls_ping(r) -> None:
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert calls and {call["function"]["name"] for call in calls} == {"ping"}, r.text


def _at_most_one_call(r) -> None:
    assert len(r.json()["choices"][0]["message"]["tool_calls"] or []) <= 1, r.text


# (the param a refusal names, the fields that ask for it, what shows it honoured when accepted)
OPTIONAL_FIELDS: list[tuple[str, dict, Callable[[Any], None] | None]] = [
    ("stream", {"stream": True}, _streamed),
    ("response_format", {"response_format": {"type": "json_object"}, "max_tokens": 24}, _json_reply),
    ("tool_choice", {"tools": [PING], "tool_choice": "required", "max_tokens": 48}, _calls_ping),
    ("parallel_tool_calls", {"tools": [PING], "parallel_tool_calls": False, "max_tokens": 48}, _at_most_one_call),
    ("tools[0].function.strict", {"tools": [{**PING, "function": {**PING["function"], "strict": True}}]}, None),
    ("frequency_penalty", {"frequency_penalty": 1.0}, None),
    ("presence_penalty", {"presence_penalty": 1.0}, None),
    ("logit_bias", {"logit_bias": {"0": -100}}, None),
    ("context_management", {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, None),
    # refused where vLLM's CPU engine would crash on it (leyline_vllm.api_server.sampling)
    ("seed", {"seed": 7, "temperature": 1.0}, None),
]


def a_bound_chat_honours_or_refuses_each_optional_field(c: Client) -> None:
    """A field an engine cannot honour is refused by name, and the refused request changes nothing."""
    for param, fields, honoured in OPTIONAL_FIELDS:
        info = new_session(c)
        sid, before = info["session_id"], snapshot(c, info["session_id"])
        r = post_chat(c, sid, [*history(4), user("Is the line up?")], **fields)
        if r.status_code == 400:
            err = assert_openai_error(r, 400, param)
            assert param in err["message"], err
            assert snapshot(c, sid) == before, param
        else:
            assert r.status_code == 200, (param, r.text)
            if honoured is not None:
                honoured(r)


CONTRACT: list[Callable[[Client], None]] = [
    lifecycle, a_directive_batch_edits_messages, outcomes_name_what_each_edit_was_applied_as,
    erase_edits_are_recomputed_whatever_their_mode, unknown_session_is_404_everywhere,
    version_conflict_changes_nothing, bad_spans_change_nothing, invalid_bodies_are_422_and_unparseable_ones_400,
    a_bound_chat_builds_then_edits_its_session, a_bound_chat_names_why_it_rebuilt, a_bound_chat_validates_its_fields,
    a_bound_chat_honours_its_sampling_fields, a_bound_chat_honours_or_refuses_each_optional_field,
]


def contract_cases() -> Any:
    """``@pytest.mark.parametrize("check", **contract_cases())`` for a backend's test module."""
    return {"argvalues": CONTRACT, "ids": [f.__name__ for f in CONTRACT]}



