"""Reliability of a real ``leyline-runtime serve`` process on loopback: what one hostile request can do.

* A 10 MB message is refused (413) while ``/healthz`` keeps answering within
  200 ms: checked with the limits raised so the message is read and parsed,
  and with a body over the limit, refused from its Content-Length unread.
* A slow client (half a body, then silence) gets 408 after ``--body-timeout``
  and its connection is closed, while other clients are served meanwhile.
* ``--state-dir``: SIGTERM saves the session histories, a restart restores
  them (same messages, same version), at the cost of a re-prefill.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from served_runtime import free_port, serve_command, wait_until_up

HEALTH_BOUND_S = 0.2
TRIES = 3
MIB = 2**20


class Server:
    def __init__(self, log_path: Path, *extra: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # open (no API keys): these tests are about limits, not auth
        command = serve_command(self.port, ["--max-cache-tokens", "8192", "--threads", "1", "--log-level", "warning"])
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([*command, *extra], stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_until_up(self.proc, self.port, log_path)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("reliability") / "serve.log",
                 "--max-body-bytes", str(16 * MIB), "--max-message-bytes", str(16 * MIB), "--body-timeout", "1")
    try:
        yield srv
    finally:
        srv.stop()


def health_latencies_while(base: str, send) -> tuple[httpx.Response, list[float]]:
    """Poll /healthz from a warm keep-alive client while ``send()`` runs in a thread."""
    result: dict[str, httpx.Response] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["response"] = send()
        finally:
            done.set()

    latencies: list[float] = []
    with httpx.Client(base_url=base, timeout=10) as client:
        client.get("/healthz")  # connection up before the clock starts
        worker = threading.Thread(target=run)
        worker.start()
        while not done.is_set():
            t0 = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)
        worker.join()
    return result["response"], latencies


def ten_mb_body() -> bytes:
    return json.dumps({"messages": [{"role": "tool", "content": "0123456789" * 1_000_000}]}).encode()


def test_a_10mb_message_is_refused_while_healthz_answers(server):
    body = ten_mb_body()
    with httpx.Client(base_url=server.base, timeout=60) as warm:  # first requests pay one-off costs
        warm.post("/sessions", json={"session_id": "warm", "messages": [{"role": "user", "content": "hi"}]})

    def send() -> httpx.Response:
        return httpx.post(f"{server.base}/sessions", content=body, timeout=60,
                          headers={"Content-Type": "application/json"})

    # The bound is on the server; on a shared, oversubscribed machine the OS can
    # also stall the client or the server for a moment. The old failure was a
    # 9-25 s freeze on every try; a scheduling hiccup does not repeat three times.
    worst = []
    for _ in range(TRIES):
        response, latencies = health_latencies_while(server.base, send)
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "request_too_large"
        assert "tokens" in response.json()["error"]["message"]  # refused by the token bound, not tokenised
        assert latencies
        worst.append(max(latencies))
        if worst[-1] < HEALTH_BOUND_S:
            break
    assert min(worst) < HEALTH_BOUND_S, worst
    assert httpx.get(f"{server.base}/sessions").json()["sessions"][0]["session_id"] == "warm"


def test_a_body_over_the_limit_is_refused_unread(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (20 * MIB))
        status, headers, body = read_response(sock)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert headers.get("connection") == "close"


def test_a_body_over_the_limit_on_v1_is_an_openai_error(server):
    """The guard answers before any route runs, yet ``/v1`` clients still get OpenAI's error shape."""
    import openai

    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="leyline-default", max_tokens=1,
                                       messages=[{"role": "user", "content": "x" * (17 * MIB)}])
    assert caught.value.status_code == 413
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert "--max-body-bytes" in error["message"] and "param" in error


def test_a_slow_client_gets_408_and_others_are_served(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        t0 = time.monotonic()
        sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"messages\": [")
        # meanwhile another client is served normally
        assert httpx.get(f"{server.base}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{server.base}/sessions", timeout=5).status_code == 200
        status, headers, body = read_response(sock)
        waited = time.monotonic() - t0
        assert sock.recv(1) == b""  # the server closed the connection
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    assert 0.9 <= waited < 10, waited


@pytest.mark.slow  # two server starts (~17 s on 2 cores): make test-slow
def test_state_dir_survives_a_restart(tmp_path):
    state = tmp_path / "state"
    first = Server(tmp_path / "first.log", "--state-dir", str(state))
    try:
        assert httpx.get(f"{first.base}/healthz").json()["durability"] == "snapshot"
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo <|end|>"}]
        httpx.post(f"{first.base}/sessions", json={"session_id": "keep.me", "messages": messages}).raise_for_status()
        httpx.post(f"{first.base}/sessions/keep.me/messages",
                   json={"messages": [{"role": "assistant", "content": "hi"}]}).raise_for_status()
        before = httpx.get(f"{first.base}/sessions/keep.me", params={"include_messages": True}).json()
    finally:
        first.stop(signal.SIGTERM)  # uvicorn shuts down gracefully, then re-raises the signal
    assert (state / "sessions.json").exists(), first.log_path.read_text()
    second = Server(tmp_path / "second.log", "--state-dir", str(state))
    try:
        after = httpx.get(f"{second.base}/sessions/keep.me", params={"include_messages": True}).json()
        for key in ("version", "num_tokens", "num_messages", "segments", "messages"):
            assert after[key] == before[key], key
        assert after["counters"]["prefilled_tokens"] == before["num_tokens"]  # the cost: one re-prefill
        r = httpx.post(f"{second.base}/sessions/keep.me/messages", json={
            "messages": [{"role": "user", "content": "again"}], "expected_version": before["version"]})
        assert r.status_code == 200, r.text
    finally:
        second.stop()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body
