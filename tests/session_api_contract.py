"""The native REST contract, defined once and run against every backend.

``tests/server/test_server_api.py`` runs it against the bundled runtime (in-process),
``tests/vllm/test_vllm_api_contract.py`` against ``vllm serve`` with Leyline's
plugin. Each check takes an HTTP client (``get``/``post``/``delete`` relative
to the server, JSON bodies) and asserts only what every backend promises: paths,
status codes, the error body, versions and message counts — never token counts,
which depend on the model's chat template.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


from leyline_sdk.protocol import MAX_DIRECTIVES

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


def invalid_bodies_and_ids_are_422_validation_errors(c: Client) -> None:
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
    r = c.post("/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(r, 422, "validation_error")


CONTRACT: list[Callable[[Client], None]] = [
    lifecycle, a_directive_batch_edits_messages, unknown_session_is_404_everywhere,
    version_conflict_changes_nothing, bad_spans_change_nothing, invalid_bodies_and_ids_are_422_validation_errors,
]


def contract_cases() -> Any:
    """``@pytest.mark.parametrize("check", **contract_cases())`` for a backend's test module."""
    return {"argvalues": CONTRACT, "ids": [f.__name__ for f in CONTRACT]}



