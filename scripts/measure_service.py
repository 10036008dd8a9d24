"""Measure the HTTP service: generate throughput and directive latency. Prints JSON.

1. ``--sessions`` concurrent clients, each on its own session, each sending
   ``--requests`` ``POST /sessions/{id}/generate`` (``--max-tokens``) back to
   back: requests/s, generated tokens/s, request latency p50/p95.
2. One session of about ``--context`` tokens; ``--edits`` times
   ``POST /directives`` replacing one middle message (amortize), alternating
   a shorter and a longer text so the suffix is rotated each time while the
   context stays put: latency p50/p95 as the client sees it and as the
   runtime reports it (``elapsed_ms``).

In-process by default (the real app through ``httpx.ASGITransport``, no
network); ``--url`` measures a running ``leyline-runtime serve`` instead.

    python scripts/measure_service.py [--url http://127.0.0.1:8000] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time

import httpx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": round(percentile(ms, 0.5), 2), "p95_ms": round(percentile(ms, 0.95), 2),
            "mean_ms": round(statistics.fmean(ms), 2), "n": len(ms)}


async def post(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    r = await client.post(path, json=body)
    if r.status_code >= 400:
        raise RuntimeError(f"{path}: {r.status_code} {r.text}")
    return r.json()


# --- 1. concurrent generation -------------------------------------------------------------


async def measure_generate(client: httpx.AsyncClient, args: argparse.Namespace) -> dict:
    sessions = []
    for i in range(args.sessions):
        info = await post(client, "/sessions", {"messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Session {i}: tell me something about paged KV caches."}]})
        sessions.append(info["session_id"])
    body = {"max_tokens": args.max_tokens, "temperature": 0}
    await post(client, f"/sessions/{sessions[0]}/generate", body)  # warm-up

    latencies: list[float] = []
    tokens = 0

    async def one_client(sid: str) -> None:
        nonlocal tokens
        for _ in range(args.requests):
            t0 = time.perf_counter()
            result = await post(client, f"/sessions/{sid}/generate", body)
            latencies.append(time.perf_counter() - t0)
            tokens += result["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client(sid) for sid in sessions))
    wall = time.perf_counter() - t0
    for sid in sessions:
        await client.delete(f"/sessions/{sid}")
    return {"sessions": args.sessions, "requests": len(latencies), "max_tokens": args.max_tokens,
            "wall_s": round(wall, 3), "requests_per_s": round(len(latencies) / wall, 3),
            "completion_tokens_per_s": round(tokens / wall, 1), "latency": summary_ms(latencies)}


# --- 2. directive latency at a given context ------------------------------------------------


def filler(i: int, words: int) -> str:
    return " ".join(f"item{i}x{k}" for k in range(words))


async def measure_directives(client: httpx.AsyncClient, args: argparse.Namespace) -> dict:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    info = await post(client, "/sessions", {"messages": messages})
    sid = info["session_id"]
    i = 0
    while info["num_tokens"] < args.context:  # grow to about --context tokens
        role = "user" if i % 2 == 0 else "assistant"
        info = await post(client, f"/sessions/{sid}/messages",
                          {"messages": [{"role": role, "content": filler(i, 12)}]})
        i += 1
    target = info["num_messages"] // 2
    role = "user" if (target - 1) % 2 == 0 else "assistant"
    # A long and a short version of the message: each edit shifts everything
    # after it (about half the context), so the suffix is rotated every time.
    texts = [filler(10_000, 6), filler(20_000, 12)]

    client_s: list[float] = []
    server_ms: list[float] = []
    outcome = None
    for k in range(args.edits + 1):
        body = {"session_id": sid, "directives": [{
            "span": {"start": target, "end": target + 1},
            "replacement": [{"role": role, "content": texts[k % 2]}], "mode": "amortize"}]}
        t0 = time.perf_counter()
        result = await post(client, "/directives", body)
        if k == 0:
            continue  # warm-up
        client_s.append(time.perf_counter() - t0)
        server_ms.append(result["elapsed_ms"])
        outcome = result["outcomes"][0]
    await client.delete(f"/sessions/{sid}")
    server = summary_ms([m / 1000 for m in server_ms])
    return {"context_tokens": info["num_tokens"], "messages": info["num_messages"], "edited_message": target,
            "edits": args.edits, "client": summary_ms(client_s), "runtime_elapsed": server,
            "last_outcome": outcome}


# --- main -------------------------------------------------------------------------------------


def in_process_client(args: argparse.Namespace) -> tuple[httpx.AsyncClient, dict]:
    import torch

    from leyline_runtime import create_app
    from leyline_runtime.runtime import RuntimeConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    config = RuntimeConfig(device=args.device, dtype=args.dtype, max_cache_tokens=args.max_cache_tokens)
    app = create_app(config)
    runtime = app.state.runtime
    setup = {"target": "in-process (httpx.ASGITransport)", "device": args.device, "dtype": args.dtype,
             "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "parameters": sum(p.numel() for p in runtime.model.parameters()),
             "max_cache_tokens": args.max_cache_tokens}
    if args.device.startswith("cuda"):
        setup["gpu"] = torch.cuda.get_device_name(0)
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://leyline", timeout=None), setup


async def main_async(args: argparse.Namespace) -> dict:
    if args.url:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        client = httpx.AsyncClient(base_url=args.url, headers=headers, timeout=None)
        setup = {"target": args.url}
    else:
        client, setup = in_process_client(args)
    setup.update(cpu=platform.processor() or platform.machine(), python=platform.python_version())
    async with client:
        generate = await measure_generate(client, args)
        directives = await measure_directives(client, args)
    return {"setup": setup, "generate": generate, "directives": directives}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (default: the app in-process)")
    p.add_argument("--api-key", help="API key for --url")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--requests", type=int, default=4, help="generate requests per session")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--context", type=int, default=2048, help="tokens in the directive session")
    p.add_argument("--edits", type=int, default=50)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-cache-tokens", type=int, default=32768)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (in-process only)")
    return p.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main_async(parse_args())), indent=2))
