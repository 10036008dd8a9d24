"""Concurrent agent sessions against a runtime over HTTP: edit + generate loops.

Each simulated agent creates a session with a short agent history, then
loops: ``POST /sessions/{id}/generate`` with a new tool output appended, then
``POST /directives`` clearing that output again (amortize) at the version the
generate returned. Bounded by a loop count per session and a wall-clock
deadline per level; loopback addresses only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from ..common import agent_text
from ..common.histories import PLACEHOLDER

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def check_loopback(base_url: str) -> None:
    host = urlparse(base_url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"leyline-bench serve only loads loopback servers, not {host!r}")


@dataclass
class Recorder:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    loops: int = 0

    async def call(self, client: httpx.AsyncClient, endpoint: str, method: str, url: str, **kw):
        t0 = time.perf_counter()
        try:
            response = await client.request(method, url, **kw)
        except httpx.HTTPError as e:
            self.errors.append(f"{endpoint}: {type(e).__name__}: {e}")
            return None
        self.latencies.setdefault(endpoint, []).append(time.perf_counter() - t0)
        if response.status_code >= 400:
            self.errors.append(f"{endpoint}: HTTP {response.status_code}: {response.text[:200]}")
            return None
        return response


def _history(k: int) -> list[dict]:
    """A short agent history: the task and the first tool round of transcript ``k``."""
    convo = agent_text.conversation(1000 + k)
    first_tool = next(i for i, m in enumerate(convo) if m.role == "tool")
    return [m.model_dump(exclude_none=True) for m in convo[: first_tool + 1]]


def _tool_outputs(k: int, n: int) -> list[str]:
    outs = [r.output.content for r in agent_text.rounds(2000 + k)]
    outs = outs or ["ok"]
    return [outs[i % len(outs)][:600] for i in range(n)]


async def agent(client: httpx.AsyncClient, rec: Recorder, k: int, loops: int, deadline: float,
                max_tokens: int) -> None:
    r = await rec.call(client, "POST /sessions", "POST", "/sessions", json={"messages": _history(k)})
    if r is None:
        return
    sid = r.json()["session_id"]
    n = r.json()["num_messages"]
    for out in _tool_outputs(k, loops):
        if time.monotonic() > deadline:
            break
        msg = {"role": "user", "content": f"Tool result:\n{out}"}
        g = await rec.call(client, "POST /sessions/{id}/generate", "POST", f"/sessions/{sid}/generate",
                           json={"messages": [msg], "max_tokens": max_tokens, "temperature": 0.0})
        if g is None:
            break
        edit = {"session_id": sid, "expected_version": g.json()["version"], "directives": [
            {"span": {"start": n, "end": n + 1}, "replacement": [{"role": "user", "content": PLACEHOLDER}],
             "mode": "amortize"}]}
        if await rec.call(client, "POST /directives", "POST", "/directives", json=edit) is None:
            break
        n += 2
        rec.loops += 1
    await rec.call(client, "DELETE /sessions/{id}", "DELETE", f"/sessions/{sid}")


async def run_level(base_url: str, sessions: int, loops: int, max_seconds: float, max_tokens: int,
                    api_key: str | None = None) -> tuple[Recorder, float]:
    check_loopback(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rec = Recorder()
    timeout = httpx.Timeout(max_seconds + 60)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, trust_env=False) as client:
        t0 = time.perf_counter()
        deadline = time.monotonic() + max_seconds
        await asyncio.gather(*(agent(client, rec, k, loops, deadline, max_tokens) for k in range(sessions)))
        return rec, time.perf_counter() - t0


# --- streaming decode load ----------------------------------------------------------------


@dataclass
class StreamRecorder:
    """Per streamed chat request: latency, time to first token, completion tokens."""

    latencies: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    probes: list[object] = field(default_factory=list)  # run_stream_level's probe, before and after


async def _stream_chat(client: httpx.AsyncClient, rec: StreamRecorder, body: dict) -> bool:
    t0 = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code >= 400:
                rec.errors.append(f"chat: HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if first is None:  # the stream opens once the first token is sampled
                    first = time.perf_counter() - t0
                data = line[len("data: "):]
                if data != "[DONE]":
                    chunk = json.loads(data)
                    if "error" in chunk:
                        rec.errors.append(f"chat: {chunk['error']}")
                        return False
                    if chunk.get("usage"):
                        rec.completion_tokens += chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        rec.errors.append(f"chat: {type(e).__name__}: {e}")
        return False
    rec.latencies.append(time.perf_counter() - t0)
    rec.ttft.append(first if first is not None else rec.latencies[-1])
    return True


async def _create_stream_session(client: httpx.AsyncClient, rec: StreamRecorder, k: int):
    sid = f"bench-stream-{k}-{time.monotonic_ns()}"
    messages = _history(k)
    r = await client.post("/sessions", json={"session_id": sid, "messages": messages})
    if r.status_code >= 400:
        rec.errors.append(f"POST /sessions: HTTP {r.status_code}")
        return None
    return sid, messages


async def streaming_agent(client: httpx.AsyncClient, rec: StreamRecorder, sid: str, messages: list[dict],
                          requests: int, max_tokens: int) -> None:
    """One session: ``requests`` streamed chat turns, each a new question on the whole history.

    Every reply is exactly ``max_tokens`` long (``min_tokens``), so levels compare like for like."""
    for i in range(requests):
        messages = messages + [{"role": "user", "content": f"Next step {i}: what do you check now?"}]
        body = {"messages": messages, "session_id": sid, "max_tokens": max_tokens, "min_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        if not await _stream_chat(client, rec, body):
            break
        info = await client.get(f"/sessions/{sid}", params={"include_messages": True})
        messages = [{key: v for key, v in m.items() if v is not None} for m in info.json()["messages"]]


async def run_stream_level(base_url: str, sessions: int, requests: int, max_tokens: int,
                           api_key: str | None = None, probe: Callable[[], object] | None = None
                           ) -> tuple[StreamRecorder, float]:
    """All sessions are created first; the clock runs from their common start to the last reply.
    ``probe()`` (blocking, optional) is called right before the clock starts and right after it stops;
    its two results are ``rec.probes``."""
    check_loopback(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rec = StreamRecorder()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=httpx.Timeout(600),
                                 trust_env=False) as client:
        made = await asyncio.gather(*(_create_stream_session(client, rec, k) for k in range(sessions)))
        made = [m for m in made if m is not None]
        try:
            if probe is not None:
                rec.probes.append(await asyncio.to_thread(probe))
            t0 = time.perf_counter()
            await asyncio.gather(*(streaming_agent(client, rec, sid, msgs, requests, max_tokens)
                                   for sid, msgs in made))
            wall = time.perf_counter() - t0
            if probe is not None:
                rec.probes.append(await asyncio.to_thread(probe))
        finally:  # a failed level leaves no sessions behind on the server
            for sid, _ in made:
                await client.delete(f"/sessions/{sid}")
        return rec, wall
