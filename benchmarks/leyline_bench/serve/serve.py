"""``leyline-bench serve``: load on a running runtime — N concurrent sessions.

Without ``--base-url`` a runtime is started on 127.0.0.1 and a free port:
``leyline-runtime serve`` in a child process (default; the load generator
shares no interpreter with it, as real clients don't), or ``--server thread``
in-process. Per concurrency level, two phases:

1. decode: every session streams ``--stream-requests`` chat turns
   (``/v1/chat/completions``, bound to its session, ``--stream-max-tokens``):
   aggregate decode tokens/s, request latency and time to first token p50/p95;
2. edit loops: generate (append a tool result) + an amortize directive:
   loops/s, requests/s, p50/p95/p99 latency per endpoint.

Errors must be 0 (the exit status is 1 otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx
from prometheus_client.parser import text_string_to_metric_families

from leyline_runtime.engine.stats import KINDS
from leyline_runtime.model.layers import CPU_GEMMS, set_cpu_gemm
from leyline_runtime.runtime import RuntimeConfig
from ..common import plots
from ..common.inproc import serve_in_subprocess, serve_in_thread
from .loadgen import run_level, run_stream_level
from ..common.output import md_table, write_results
from ..common.stats import percentile, ratio


def add_parser(sub) -> None:
    p = sub.add_parser("serve")
    p.add_argument("--base-url", default=None, help="a running runtime on loopback (default: start one in-process)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16],
                   help="concurrent sessions, one level per value")
    p.add_argument("--loops", type=int, default=4, help="edit+generate loops per session")
    p.add_argument("--max-seconds", type=float, default=180.0, help="per level: no new loop after this")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per generate in the edit loops")
    p.add_argument("--stream-requests", type=int, default=4, help="streamed chat turns per session (decode phase)")
    p.add_argument("--stream-max-tokens", type=int, default=32, help="tokens per streamed generation")
    p.add_argument("--api-key", default=None, help="API key the server requires (default: none)")
    p.add_argument("--server", default="process", choices=["process", "thread"],
                   help="without --base-url: run the server in a child process (default) or a thread")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="without --base-url: start the server with --batch-invariant")
    p.add_argument("--cpu-gemm", choices=list(CPU_GEMMS), default="auto",
                   help="without --base-url: the server's --cpu-gemm (default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="without --base-url: the server's --dtype (default: %(default)s)")
    p.set_defaults(run=run, quick_overrides={"concurrency": [1, 2], "loops": 1, "max_tokens": 2,
                                             "stream_requests": 1, "stream_max_tokens": 4})


def _server(args):
    if args.base_url:
        return contextlib.nullcontext(args.base_url)
    if args.server == "thread":
        set_cpu_gemm(args.cpu_gemm)
        return serve_in_thread(RuntimeConfig(model_path=args.model, api_keys=[args.api_key] if args.api_key else [],
                                             batch_invariant=args.batch_invariant, dtype=args.dtype))
    cli = [*(["--model", args.model] if args.model else []), *(["--api-key", args.api_key] if args.api_key else []),
           *(["--threads", str(args.threads)] if args.threads else []),
           *(["--batch-invariant"] if args.batch_invariant else []), "--cpu-gemm", args.cpu_gemm,
           "--dtype", args.dtype]
    return _url_of(serve_in_subprocess(cli))


@contextlib.contextmanager
def _url_of(serving):
    with serving as served:
        yield served.url


def _decode_stats(rec, wall: float) -> dict:
    def q(values):
        return {"p50": percentile(values, 50), "p95": percentile(values, 95)}

    return {"wall_s": wall, "requests": len(rec.latencies), "completion_tokens": rec.completion_tokens,
            "tokens_per_s": rec.completion_tokens / wall if wall else None,
            "latency_s": q(rec.latencies), "ttft_s": q(rec.ttft), "errors": len(rec.errors),
            "error_samples": rec.errors[:10]}


def engine_counters(base_url: str, api_key: str | None) -> dict[tuple[str, str], float] | None:
    """The runtime's ``leyline_engine_*`` counters by (name, kind); None where /metrics does not show them
    (another server, or a tenant key: engine figures are the admin's)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=30, trust_env=False)
        response.raise_for_status()
        families = list(text_string_to_metric_families(response.text))
    except (httpx.HTTPError, ValueError):  # no /metrics there, or not Prometheus text
        return None
    found = {(sample.name, sample.labels["kind"]): sample.value
             for family in families if family.name.startswith("leyline_engine_")
             for sample in family.samples if sample.name.endswith("_total") and "kind" in sample.labels}
    return found or None


def _engine_stats(before, after, wall: float) -> dict | None:
    """What the engine did during a phase: busy share of the wall time, and per kind of step their
    number, mean time and (decode) mean batch width."""
    if before is None or after is None:
        return None

    def grew(name: str, kind: str) -> float:
        key = (f"leyline_engine_{name}_total", kind)
        return after.get(key, 0.0) - before.get(key, 0.0)

    out = {"busy_share": sum(grew("step_seconds", k) for k in KINDS) / wall if wall else None}
    for kind in KINDS:
        steps = grew("steps", kind)
        out[kind] = {"steps": int(steps), "mean_step_ms": grew("step_seconds", kind) / steps * 1000 if steps else None,
                     "mean_sequences": grew("step_sequences", kind) / steps if steps else None,
                     "tokens": int(grew("step_tokens", kind))}
    return out


def _level_stats(sessions: int, rec, wall: float) -> dict:
    requests = sum(len(v) for v in rec.latencies.values())
    return {
        "sessions": sessions, "wall_s": wall, "loops": rec.loops, "requests": requests,
        "loops_per_s": rec.loops / wall if wall else None, "requests_per_s": requests / wall if wall else None,
        "errors": len(rec.errors), "error_samples": rec.errors[:10],
        "latency_s": {ep: {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95), "p99": percentile(v, 99)}
                      for ep, v in sorted(rec.latencies.items())},
    }


def run(args, log=print) -> dict:
    api_key = args.api_key or (os.environ.get("LEYLINE_API_KEYS", "").split(",")[0].strip() or None)
    args.api_key = api_key
    levels = []
    with _server(args) as base_url:
        for n in args.concurrency:
            srec, swall = asyncio.run(run_stream_level(base_url, n, args.stream_requests, args.stream_max_tokens,
                                                       api_key, probe=lambda: engine_counters(base_url, api_key)))
            decode = _decode_stats(srec, swall)
            decode["engine"] = _engine_stats(*srec.probes, swall)
            rec, wall = asyncio.run(run_level(base_url, n, args.loops, args.max_seconds, args.max_tokens, api_key))
            levels.append({**_level_stats(n, rec, wall), "decode": decode})
            s = levels[-1]
            log(f"serve sessions={n}: decode {decode['tokens_per_s']:.1f} tok/s, latency p50 "
                f"{(decode['latency_s']['p50'] or 0) * 1000:.0f} ms, ttft p50 {(decode['ttft_s']['p50'] or 0) * 1000:.0f}"
                f" ms; {s['loops']} edit loops in {wall:.1f} s ({s['requests_per_s']:.2f} req/s), "
                f"errors {s['errors'] + decode['errors']}")
    errors = sum(s["errors"] + s["decode"]["errors"] for s in levels)
    result = {"benchmark": "serve", "base_url": args.base_url or f"local ({args.server})",
              "settings": {"concurrency": args.concurrency, "loops": args.loops, "max_seconds": args.max_seconds,
                           "max_tokens": args.max_tokens, "stream_requests": args.stream_requests,
                           "stream_max_tokens": args.stream_max_tokens, "batch_invariant": args.batch_invariant,
                           "cpu_gemm": None if args.base_url else args.cpu_gemm,
                           "dtype": None if args.base_url else args.dtype},
              "levels": levels, "errors": errors, "failed": errors > 0,
              "notes": ["Decode phase: streamed, session-bound chat turns; tokens/s = completion tokens of all "
                        "sessions / wall time from their common start; TTFT = time to the first SSE event.",
                        "One edit loop = generate (append a tool result, max_tokens new tokens) + an amortize "
                        "directive.",
                        "All sessions' decode steps share one batched forward per engine step.",
                        "Engine: the runtime's leyline_engine_* counters scraped before and after the decode "
                        "phase; busy = engine step time / wall time; a mixed step runs decode steps beside "
                        "prefill chunks (each turn's new message)."]}
    payload = write_results(args.out, "serve", result, "leyline-bench serve", _markdown(levels))
    _plot(args.out, levels)
    return payload


def _markdown(levels) -> str:
    return _decode_markdown(levels) + "\n\n" + _engine_markdown(levels) + _loops_markdown(levels)


def _engine_markdown(levels) -> str:
    rows = []
    for s in levels:
        e = s["decode"].get("engine")
        if e is None:
            continue
        d, m, p = e["decode"], e["mixed"], e["prefill"]
        rows.append([s["sessions"], f"{e['busy_share'] * 100:.0f}%" if e["busy_share"] is not None else None,
                     d["steps"], d["mean_sequences"], d["mean_step_ms"], m["steps"], m["mean_step_ms"],
                     p["steps"], p["mean_step_ms"]])
    if not rows:
        return ""
    headers = ["sessions", "engine busy", "decode steps", "sequences per decode step", "decode step ms",
               "mixed steps", "mixed step ms", "prefill steps", "prefill step ms"]
    return ("## Engine during the decode phase (from `/metrics`: `leyline_engine_*`)\n\n"
            + md_table(headers, rows) + "\n\n")


def _decode_markdown(levels) -> str:
    base = levels[0]["decode"] if levels else {}
    headers = ["sessions", "decode tok/s", "× 1 session", "latency p50/p95 ms", "p50 × 1 session",
               "TTFT p50/p95 ms", "requests", "errors"]
    rows = []
    for s in levels:
        d = s["decode"]
        lat, ttft = d["latency_s"], d["ttft_s"]
        rows.append([s["sessions"], d["tokens_per_s"], ratio(d["tokens_per_s"], base.get("tokens_per_s")),
                     "/".join(f"{(lat[k] or 0) * 1000:.0f}" for k in ("p50", "p95")),
                     ratio(lat["p50"], base.get("latency_s", {}).get("p50")),
                     "/".join(f"{(ttft[k] or 0) * 1000:.0f}" for k in ("p50", "p95")), d["requests"], d["errors"]])
    return "## Decode (streamed chat turns)\n\n" + md_table(headers, rows)


def _loops_markdown(levels) -> str:
    endpoints = sorted({ep for s in levels for ep in s["latency_s"]})
    headers = ["sessions", "loops/s", "req/s", "errors", *[f"{ep} p50/p95/p99 ms" for ep in endpoints]]
    rows = []
    for s in levels:
        cells = []
        for ep in endpoints:
            q = s["latency_s"].get(ep)
            cells.append("/".join(f"{q[k] * 1000:.0f}" for k in ("p50", "p95", "p99")) if q else None)
        rows.append([s["sessions"], s["loops_per_s"], s["requests_per_s"], s["errors"], *cells])
    return ("## Edit loops (generate + directive)\n\n" + md_table(headers, rows)
            + "\n\n![serve latency](serve_latency.png)\n")


def _plot(out, levels) -> None:
    if not levels:
        return
    xs = [s["sessions"] for s in levels]
    endpoints = sorted({ep for s in levels for ep in s["latency_s"]})
    series = {f"{ep} p95": [s["latency_s"].get(ep, {}).get("p95") for s in levels] for ep in endpoints}
    plots.lines(f"{out}/serve_latency.png", "p95 latency per endpoint", xs, series, "concurrent sessions",
                "seconds", logy=True)
