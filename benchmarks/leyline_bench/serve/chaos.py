"""``leyline-bench chaos``: mixed valid and hostile load on a real ``leyline-runtime serve``.

16 clients (``--clients``) run for a bounded time. Each keeps its own
sessions and picks, request by request, a valid call (create, append,
generate, directives, bound chat, inspect, list, health, metrics) or a
malformed one (bad ids, lone surrogates, out-of-range seeds, control tokens
as token ids, overlapping spans, bodies over the limit, invalid UTF-8, deep
JSON, wrong methods, stale versions, half-sent bodies). Reported: requests,
status codes and error codes, server errors (5xx: must be 0, exit status 1
otherwise), valid requests that failed, p50/p95 latency of valid requests,
and the server's resident memory before and after.

The server is a subprocess (so its RSS is its own), on 127.0.0.1 and a free
port, with ``--threads`` torch threads and small request limits.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..common import plots
from ..common.inproc import serve_in_subprocess
from ..common.output import md_table, write_results
from ..common.stats import percentile

MAX_BODY = 256 * 1024
BODY_TIMEOUT = 2.0
SESSION_TOKENS_CAP = 1500  # a client starts a new session past this


def add_parser(sub) -> None:
    p = sub.add_parser("chaos")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the clients keep sending")
    p.add_argument("--invalid-share", type=float, default=0.4, help="share of malformed requests")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens per generation")
    p.add_argument("--seed", type=int, default=0, help="random seed of the request mix")
    p.set_defaults(run=run, quick_overrides={"clients": 4, "seconds": 4.0})


@dataclass
class Record:
    statuses: Counter = field(default_factory=Counter)  # (kind, status) -> n
    codes: Counter = field(default_factory=Counter)  # error code -> n
    latency: dict[str, list[float]] = field(default_factory=dict)  # valid action -> seconds
    valid_failed: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    transport_errors: Counter = field(default_factory=Counter)


# --- the server -----------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def serve_subprocess(threads: int):
    return serve_in_subprocess(["--threads", str(threads), "--max-body-bytes", str(MAX_BODY), "--max-message-bytes",
                                str(64 * 1024), "--max-messages", "64", "--body-timeout", str(BODY_TIMEOUT)],
                               startup_timeout=180, log_level="error")


# --- one client -----------------------------------------------------------------------------


def user(text: str) -> dict:
    return {"role": "user", "content": text}


class Client:
    def __init__(self, index: int, http: httpx.AsyncClient, base: str, port: int, rng: random.Random, args,
                 rec: Record):
        self.index, self.http, self.base, self.port, self.rng, self.args, self.rec = index, http, base, port, rng, \
            args, rec
        self.sid = ""
        self.serial = 0
        self.history: list[dict] = []

    async def run(self, until: float) -> None:
        await self.new_session()
        while time.monotonic() < until:
            if self.rng.random() < self.args.invalid_share:
                await self.invalid()
            else:
                await self.valid()

    # -- valid requests: must succeed ---------------------------------------------------------

    async def new_session(self) -> None:
        self.serial += 1
        self.sid = f"c{self.index}-{self.serial}"
        self.history = [{"role": "system", "content": "You are terse."}, user(f"hello from client {self.index}")]
        await self.call("create", "POST", "/sessions", {"session_id": self.sid, "messages": self.history})

    async def valid(self) -> None:
        action = self.rng.choices(["generate", "append", "directive", "chat", "get", "list", "healthz", "metrics"],
                                  weights=[4, 3, 2, 2, 2, 1, 1, 1])[0]
        if action == "generate":
            body = await self.call("generate", "POST", f"/sessions/{self.sid}/generate",
                                   {"messages": [user("go on")], "max_tokens": self.args.max_tokens, "temperature": 0})
            if body:
                self.history += [user("go on"), body["message"]]
        elif action == "append":
            msg = {"role": "tool", "content": f"result {self.rng.randint(0, 10**6)} <|end|> ok"}
            if await self.call("append", "POST", f"/sessions/{self.sid}/messages", {"messages": [msg]}):
                self.history.append(msg)
        elif action == "directive":
            new = user(f"edited {self.rng.randint(0, 999)}")
            last = len(self.history) - 1
            if await self.call("directives", "POST", "/directives", {"session_id": self.sid, "directives": [
                    {"span": {"start": last, "end": last + 1}, "replacement": [new]}]}):
                self.history[last] = new
        elif action == "chat":
            messages = [*self.history, user("and?")]
            body = await self.call("chat", "POST", "/v1/chat/completions", {
                "session_id": self.sid, "messages": messages, "max_tokens": self.args.max_tokens, "temperature": 0})
            if body:
                choice = body["choices"][0]["message"]
                self.history = [*messages, {"role": "assistant", "content": choice.get("content") or "",
                                            **({"tool_calls": choice["tool_calls"]} if choice.get("tool_calls")
                                               else {})}]
        elif action == "get":
            info = await self.call("get", "GET", f"/sessions/{self.sid}")
            if info and info["num_tokens"] > SESSION_TOKENS_CAP:
                await self.call("delete", "DELETE", f"/sessions/{self.sid}")
                await self.new_session()
        elif action == "list":
            await self.call("list", "GET", "/sessions")
        else:
            await self.call(action, "GET", f"/{action}")

    # -- malformed requests: must be 4xx ------------------------------------------------------

    async def invalid(self) -> None:
        sid, rng = self.sid, self.rng
        kinds = {
            "bad-id": ("POST", "/sessions", {"session_id": rng.choice(["a/b", "..", "", "é", "x" * 129])}),
            "surrogate": ("POST", f"/sessions/{sid}/messages", {"messages": [user("x\ud800")]}),
            "seed": ("POST", f"/sessions/{sid}/generate", {"messages": [user("hi")], "seed": 2**64}),
            "special-id": ("POST", "/directives", {"session_id": sid, "directives": [
                {"span": {"start": 1, "end": 2, "unit": "token"}, "replacement": [rng.randint(0, 8)]}]}),
            "beyond-vocab": ("POST", "/directives", {"session_id": sid, "directives": [
                {"span": {"start": 1, "end": 2, "unit": "token"}, "replacement": [10**7]}]}),
            "overlap": ("POST", "/directives", {"session_id": sid, "directives": [
                {"span": {"start": 0, "end": 2}}, {"span": {"start": 1, "end": 2}}]}),
            "stale-version": ("POST", f"/sessions/{sid}/messages", {"messages": [user("x")],
                                                                   "expected_version": 10**6}),
            "unknown-session": ("GET", f"/sessions/nope-{rng.randint(0, 10**6)}", None),
            "wrong-method": ("PUT", "/sessions", None),
            "too-many-messages": ("POST", f"/sessions/{sid}/messages", {"messages": [user("x")] * 65}),
            "body-too-large": ("POST", f"/sessions/{sid}/messages", {"messages": [user("x" * (MAX_BODY + 10))]}),
            "invalid-utf8": ("POST", "/sessions", b'{"messages": [{"role": "user", "content": "\xff"}]}'),
            "deep-json": ("POST", "/sessions", b"[" * 50_000 + b"]" * 50_000),
            "chat-bad-role": ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}),
            "over-cache": ("POST", f"/sessions/{sid}/generate", {"max_tokens": 8192, "messages": [user("x" * 9000)]}),
        }
        if rng.random() < 0.02:
            await self.slow_client()
            return
        kind = rng.choice(sorted(kinds))
        method, path, body = kinds[kind]
        await self.call(f"invalid:{kind}", method, path, body, valid=False)

    async def slow_client(self) -> None:
        """Half a body, then silence: the server must answer 408 and close."""
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"messages\"")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout=BODY_TIMEOUT + 10)
            writer.close()
            status = int(line.split()[1]) if line else 0
        except (OSError, asyncio.TimeoutError, ValueError, IndexError) as exc:
            self.rec.transport_errors[f"slow-client: {type(exc).__name__}"] += 1
            return
        self.rec.statuses[("invalid", status)] += 1
        self.rec.codes["request_timeout" if status == 408 else f"slow-client-{status}"] += 1
        if status >= 500:
            self.rec.server_errors.append(f"slow-client -> {status}")
        del t0

    # -- bookkeeping ---------------------------------------------------------------------------

    async def call(self, action: str, method: str, path: str, body=None, valid: bool = True):
        kind = "valid" if valid else "invalid"
        headers = {"Content-Type": "application/json"}
        content = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        t0 = time.perf_counter()
        try:
            r = await self.http.request(method, self.base + path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            self.rec.transport_errors[f"{action}: {type(exc).__name__}"] += 1
            return None
        elapsed = time.perf_counter() - t0
        self.rec.statuses[(kind, r.status_code)] += 1
        if r.status_code >= 500:
            self.rec.server_errors.append(f"{method} {path} -> {r.status_code}: {r.text[:200]}")
        if r.status_code >= 400:
            try:
                self.rec.codes[r.json()["error"]["code"]] += 1
            except (ValueError, KeyError, TypeError):
                self.rec.codes[f"unparsed-{r.status_code}"] += 1
        if valid:
            self.rec.latency.setdefault(action, []).append(elapsed)
            if r.status_code >= 300:
                self.rec.valid_failed.append(f"{method} {path} -> {r.status_code}: {r.text[:200]}")
                return None
            return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code < 400:
            self.rec.valid_failed.append(f"malformed {action} was accepted: {r.status_code}")
        return None


async def run_clients(base: str, port: int, args) -> tuple[Record, float]:
    rec = Record()
    until = time.monotonic() + args.seconds
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        clients = [Client(i, http, base, port, random.Random(f"{args.seed}:{i}"), args, rec)
                   for i in range(args.clients)]
        t0 = time.perf_counter()
        await asyncio.gather(*(c.run(until) for c in clients))
        return rec, time.perf_counter() - t0


# --- the benchmark ----------------------------------------------------------------------------


def run(args, log=print) -> dict:
    threads = args.threads or 1
    with serve_subprocess(threads) as served:
        base, pid, command = served.url, served.pid, served.command
        httpx.post(f"{base}/v1/chat/completions", json={"messages": [user("warm up")], "max_tokens": 2},
                   timeout=120)
        rss_before = rss_bytes(pid)
        rec, wall = asyncio.run(run_clients(base, int(base.rsplit(":", 1)[1]), args))
        rss_after = rss_bytes(pid)
        alive = httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    valid_lat = [x for v in rec.latency.values() for x in v]
    requests = sum(rec.statuses.values())
    server_errors = len(rec.server_errors)
    result = {
        "benchmark": "chaos", "server_command": " ".join(os.path.basename(c) if i == 0 else c
                                                        for i, c in enumerate(command)),
        "settings": {"clients": args.clients, "seconds": args.seconds, "invalid_share": args.invalid_share,
                     "max_tokens": args.max_tokens, "seed": args.seed, "server_threads": threads},
        "wall_s": wall, "requests": requests, "requests_per_s": requests / wall if wall else None,
        "valid_requests": sum(n for (k, _), n in rec.statuses.items() if k == "valid"),
        "invalid_requests": sum(n for (k, _), n in rec.statuses.items() if k == "invalid"),
        "status_codes": {f"{k} {s}": n for (k, s), n in sorted(rec.statuses.items())},
        "error_codes": dict(sorted(rec.codes.items())),
        "server_errors": server_errors, "server_error_samples": rec.server_errors[:10],
        "valid_failed": len(rec.valid_failed), "valid_failed_samples": rec.valid_failed[:10],
        "transport_errors": dict(rec.transport_errors),
        "valid_latency_s": {"p50": percentile(valid_lat, 50), "p95": percentile(valid_lat, 95),
                            "max": max(valid_lat, default=None)},
        "valid_latency_by_action_s": {a: {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95)}
                                      for a, v in sorted(rec.latency.items())},
        "rss_bytes": {"before": rss_before, "after": rss_after},
        "healthy_after": alive,
        "failed": server_errors > 0 or not alive or bool(rec.valid_failed) or bool(rec.transport_errors),
    }
    log(f"chaos: {requests} requests in {wall:.1f} s, 5xx {server_errors}, valid failed {len(rec.valid_failed)}, "
        f"valid p95 {result['valid_latency_s']['p95']}, RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    payload = write_results(args.out, "chaos", result, "leyline-bench chaos", _markdown(result))
    by_action = result["valid_latency_by_action_s"]
    plots.grouped_bars(Path(args.out) / "chaos_latency.png", "chaos: valid requests under mixed load",
                       list(by_action), {q: [_ms(v[q]) for v in by_action.values()] for q in ("p50", "p95")},
                       "latency (ms)")
    return payload


def _markdown(r: dict) -> str:
    mib = 2**20
    summary = md_table(["requests", "valid", "malformed", "5xx", "valid failed", "valid p50 ms", "valid p95 ms",
                        "RSS before MiB", "RSS after MiB"],
                       [[r["requests"], r["valid_requests"], r["invalid_requests"], r["server_errors"],
                         r["valid_failed"], _ms(r["valid_latency_s"]["p50"]), _ms(r["valid_latency_s"]["p95"]),
                         r["rss_bytes"]["before"] / mib, r["rss_bytes"]["after"] / mib]])
    statuses = md_table(["kind status", "requests"], list(r["status_codes"].items()))
    codes = md_table(["error code", "responses"], list(r["error_codes"].items()))
    actions = md_table(["valid action", "n", "p50 ms", "p95 ms"],
                       [[a, v["n"], _ms(v["p50"]), _ms(v["p95"])] for a, v in r["valid_latency_by_action_s"].items()])
    s = r["settings"]
    return (f"{s['clients']} clients for {s['seconds']:g} s, {s['invalid_share']:.0%} of requests malformed, "
            f"server `{r['server_command']}`.\n\n{summary}\n\n## Status codes\n\n{statuses}\n\n"
            f"## Error codes\n\n{codes}\n\n## Valid requests by action\n\n{actions}\n\n"
            "![valid latency by action](chaos_latency.png)\n")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
