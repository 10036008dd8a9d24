"""docs/operations.md says what the server does with a reply budget past the context: it clamps it.

A ``max_tokens`` (at most 8192) larger than the room left in the model's context is not refused: the reply stops at
the context's end (``finish_reason: "length"``). Only a prompt that does not fit is a 413.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient
from server_support import make_runtime, torch_threads

from leyline_runtime import create_app

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.fixture(scope="module")
def client():
    with torch_threads(1), TestClient(create_app(runtime=make_runtime())) as c:
        yield c


def tokens_of(client, words: int) -> int:
    r = client.post("/sessions", json={"session_id": "probe", "messages": [
        {"role": "user", "content": "word " * words}]})
    client.delete("/sessions/probe")
    return r.json()["num_tokens"]


def fill_to(client, session_id: str, room: int) -> int:
    """A session whose history leaves ``room`` positions of the context free, give or take; returns the
    context length."""
    context = client.get("/v1/models").json()["data"][0]["max_model_len"]
    small, large = tokens_of(client, 100), tokens_of(client, 400)
    per_word = (large - small) / 300
    words = 100 + int((context - room - small) / per_word)
    r = client.post("/sessions", json={"session_id": session_id, "messages": [
        {"role": "user", "content": "word " * words}]})
    assert r.status_code == 201, r.text
    assert context - room - 32 <= r.json()["num_tokens"] <= context - room // 2
    return context


def test_max_tokens_past_the_context_is_clamped_not_refused(client):
    context = fill_to(client, "near-the-end", room=48)
    r = client.post("/sessions/near-the-end/generate", json={"max_tokens": 8192, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["total_tokens"] <= context
    assert body["finish_reason"] in {"length", "stop"}


def test_a_prompt_past_the_context_is_a_413(client):
    context = fill_to(client, "full", room=48)
    r = client.post("/sessions/full/generate", json={"max_tokens": 1, "messages": [
        {"role": "user", "content": "word " * context}]})
    assert r.status_code == 413, r.text


def test_operations_md_says_max_tokens_is_clamped():
    text = " ".join(OPERATIONS.read_text().split())
    assert "prompt plus `max_tokens` cannot fit is a 413" not in text
    assert "`max_tokens` is clamped" in text
