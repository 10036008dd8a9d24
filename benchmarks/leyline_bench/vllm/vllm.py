"""``leyline-bench vllm``: Leyline's directives inside a real ``vllm serve``.

Starts ``vllm serve`` with Leyline's plugins (``vllm_server.py``) on a random
checkpoint of one family at one shape (``tiny_models.py``: ``--family``,
default the MLA ``deepseek_v2``; ``--shape tiny`` or a real size such as
``v2-lite-attn``) and measures, side by side in one run (``--cells``):

* ``edits``: one tool output cleared at 10/50/90% of an agent history
  (``--tokens``): Leyline ``amortize`` vs ``forget`` (session-bound chat
  requests) vs a plain resend of the same prompt tokens to vLLM's own
  ``/v1/completions`` (its prefix cache, where vLLM enables it, warmed with the
  unedited prompt under a salt of its own): request latency with one output
  token (= time to first token) and prompt tokens vLLM computed;
* ``shared``: sessions starting with one common system prompt + tools
  (``vllm_cells.py``);
* ``replay``: the shipped agent traces, cache-hit % (prompt tokens not
  computed) for plain vLLM vs Leyline amortize, each trace's plain arm under a
  salt of its own so that neither arm, nor an earlier cell, warms the other's cache;
* ``tax``: plain ``vllm serve`` vs the same server with the plugin on requests
  without Leyline parameters (``vllm_cells.py``; two more servers).

Needs vLLM (``make test-vllm`` builds ``.venv-vllm``):
``.venv-vllm/bin/python -m leyline_bench.cli vllm --out docs/perf``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from leyline_sdk import LeylineClient
from leyline_sdk.diff import apply_directives
from leyline_sdk.protocol import Directive, Message

from ..common.output import md_table, write_results
from .cells import (
    CELLS,
    MODEL,
    api_layout,
    cached,
    complete,
    parse_cells,
    post,
    shared_markdown,
    shared_prompt_cell,
    tax_cell,
    tax_markdown,
)
from leyline_testkit.tiny_models import FAMILIES, SHAPES

POSITIONS = (0.1, 0.5, 0.9)
DEFAULT_TRACES = Path(__file__).resolve().parents[3] / "benchmarks" / "traces.jsonl"
DEFAULT_FAMILY = "deepseek_v2"

__all__ = ["POSITIONS", "api_layout", "add_parser", "edit_cell", "prefix_cache_disabled", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("vllm")
    p.add_argument("--family", choices=list(FAMILIES), default=DEFAULT_FAMILY,
                   help="attention family of the random checkpoint (leyline_testkit.tiny_models.FAMILIES)")
    p.add_argument("--shape", choices=list(SHAPES), default="tiny",
                   help="its size: tiny, or a real one for the family (v2-lite-attn: deepseek_v2; "
                        "qwen3-0.6b, qwen3-1.7b: qwen3)")
    p.add_argument("--cells", type=parse_cells, default=list(CELLS), help=f"comma list of {', '.join(CELLS)}")
    p.add_argument("--tokens", type=int, nargs="+", default=[2048], help="history length(s) for the edit cells")
    p.add_argument("--repeats", type=int, default=3, help="measurements per edit cell (median reported)")
    p.add_argument("--traces", default=str(DEFAULT_TRACES), help="JSONL agent traces to replay")
    p.add_argument("--trace-limit", type=int, default=None, help="first N traces only")
    p.add_argument("--per-pattern", type=int, default=None, help="first N traces of each pattern only")
    p.add_argument("--max-turns", type=int, default=None, help="first N turns of each trace only")
    p.add_argument("--shared-sessions", type=int, default=8, help="sessions of the shared-system-prompt cell")
    p.add_argument("--shared-tokens", type=int, default=1536, help="their common prefix (system prompt + tools)")
    p.add_argument("--tax-repeats", type=int, default=3, help="paired plain/plugin repeats of the tax cell")
    p.add_argument("--tax-tokens", type=int, default=64, help="tokens generated per request in the tax cell")
    p.add_argument("--tax-requests", type=int, default=64,
                   help="requests per tax measurement, split evenly over its streams (1 stream sends them in turn)")
    p.add_argument("--block-size", type=int, default=None,
                   help="vLLM's KV block size for the served cells (CPU: a multiple of 32; default: vLLM's, 32 "
                        "with AMX); rows are claimed in whole blocks, so it sets how much around an edit is "
                        "computed again. Plain resend and Leyline arms share the server, so both get it")
    p.add_argument("--workdir", default=None, help="checkpoints + server logs (default: a temp folder)")
    p.set_defaults(run=run, quick_overrides={"tokens": [512], "repeats": 1, "trace_limit": 1, "max_turns": 3,
                                             "shared_sessions": 2, "shared_tokens": 256, "tax_repeats": 1,
                                             "tax_requests": 16})


def run(args) -> dict:
    from leyline_testkit.tiny_models import make_tiny_checkpoint, parameter_count, shape_config

    shape_config(args.family, args.shape)  # a family/shape pair that does not exist fails before any work
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="leyline-bench-vllm-"))
    checkpoint = make_tiny_checkpoint(workdir / f"{args.family}-{args.shape}", args.family, shape=args.shape)
    result = {"model": {"family": args.family, "shape": args.shape, "config": shape_config(args.family, args.shape),
                        "parameters": parameter_count(args.family, args.shape)},
              "cells": args.cells, "load_average_before": _load_average()}
    served = [c for c in args.cells if c != "tax"]
    if served:
        result.update(_served_cells(args, checkpoint, workdir, served))
    if "tax" in args.cells:
        result["tax"] = tax_cell(checkpoint, workdir / "tax", repeats=args.tax_repeats, tokens=args.tax_tokens,
                                 requests=args.tax_requests)
    result["load_average_after"] = _load_average()
    payload = write_results(args.out, "vllm", result, "Leyline on vLLM", _markdown(result))
    _plot(Path(args.out), result)
    return payload


def _served_cells(args, checkpoint: Path, workdir: Path, cells: list[str]) -> dict:
    """The cells that share one ``vllm serve`` with the plugin; each arm salted apart from the others."""
    from leyline_runtime.text.tokenizer import ChatTokenizer
    from transformers import AutoTokenizer

    from leyline_vllm.api_server.template import ChatRenderer

    from leyline_testkit.tiny_models import runtime_tokenizer_file
    from leyline_testkit.vllm_server import VllmServer, has_amx, vllm_on_cpu

    tok = ChatTokenizer.from_file(runtime_tokenizer_file())
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(checkpoint))  # the prompts the plugin builds
    out: dict = {}
    kv_space = {"VLLM_CPU_KVCACHE_SPACE": str(SHAPES[args.shape].kv_cache_gib)}
    with VllmServer(checkpoint, workdir / "serve", env=kv_space, block_size=args.block_size) as server, \
            LeylineClient(server.base_url, timeout=900) as client:
        out["engine"] = {"vllm_on_cpu": vllm_on_cpu(), "amx": has_amx(), "dtype": server.dtype,
                         "vllm_prefix_cache": not prefix_cache_disabled(server.log_text()),
                         "startup_s": server.startup_s, "block_size": args.block_size or "vLLM's default"}
        if "edits" in cells:
            warm = out["engine"]["vllm_prefix_cache"]  # without a prefix cache a warm-up would serve nothing
            out["edits"] = [edit_cell(client, server.base_url, tok, renderer, n, p, args.repeats, warm)
                            for n in args.tokens for p in POSITIONS]
        if "shared" in cells:
            out["shared"] = shared_prompt_cell(client, server.base_url, renderer, tok,
                                               sessions=args.shared_sessions, prefix_tokens=args.shared_tokens)
        if "replay" in cells:
            out["replay"] = _replay(client, server.base_url, renderer, args.traces, args.trace_limit,
                                    args.max_turns, args.per_pattern)
    return out


def _load_average() -> list[float]:
    import os

    return list(os.getloadavg())


# -- edits at 10/50/90% ---------------------------------------------------------------------------

def edit_cell(client, base_url, tok, renderer, n_tokens: int, position: float, repeats: int,
              warm: bool = True) -> dict:
    from ..common.histories import history_of_length, make_edit

    history = api_layout(history_of_length(tok, n_tokens))
    edit = make_edit(tok, history, position, "message")
    arms: dict[str, list[dict]] = {"amortize": [], "forget": [], "vllm_resend": []}
    for r in range(repeats):
        for arm in _rotated(list(arms), r):  # the arms take turns, order rotated per repeat
            # each arm of each repeat clears the output with its own text, so vLLM's prefix cache (where
            # vLLM enables it) never serves one the edited prompt another computed: an exact (unsalted)
            # arm, forget or an amortize a refused model applies as forget, would warm the next
            edited = apply_directives(history, [_numbered(edit.directive, r, list(arms).index(arm))])
            arms[arm].append(_measure(client, base_url, renderer, arm, history, edited, warm))
    cell = {"position": position, "history_tokens": n_tokens, "edit_start_token": edit.start_token,
            "span_tokens": edit.span_tokens}
    for arm, samples in arms.items():
        cell[arm] = {"latency_s": statistics.median(s["latency_s"] for s in samples),
                     "computed_tokens": statistics.median(s["computed"] for s in samples),
                     "prompt_tokens": samples[0]["prompt"], "samples": samples}
    base = cell["vllm_resend"]["latency_s"]
    for arm in ("amortize", "forget"):
        cell[arm]["speedup_vs_resend"] = base / cell[arm]["latency_s"] if cell[arm]["latency_s"] else None
    return cell


def _numbered(directive: Directive, repeat: int, arm: int) -> Directive:
    first, *rest = directive.replacement
    # "(check 2.3)": the same number of tokens for every arm, so their prompts are equally long
    marked = first.model_copy(update={"content": f"{first.content} (check {repeat + 1}.{arm + 1})"})
    return directive.model_copy(update={"replacement": [marked, *rest]})


def _measure(client: LeylineClient, base_url: str, renderer, arm: str, history: list[Message],
             edited: list[Message], warm: bool = True) -> dict:
    body = {"model": MODEL, "messages": [m.model_dump(exclude_none=True) for m in edited],
            "max_tokens": 1, "temperature": 0}
    if arm == "vllm_resend":
        salt = f"resend-{time.monotonic_ns()}"  # only its own warm-up can serve it, never another cell's rows
        if warm:
            complete(base_url, renderer.ids(history, generation_prompt=True), salt)  # warm its prefix cache
        ids = renderer.ids(edited, generation_prompt=True)
        started = time.perf_counter()
        usage = complete(base_url, ids, salt)["usage"]
        latency = time.perf_counter() - started
        return {"latency_s": latency, "computed": usage["prompt_tokens"] - cached(usage),
                "prompt": usage["prompt_tokens"]}
    sid = f"bench-{arm}-{time.monotonic_ns()}"
    client.create_session(history, session_id=sid)
    started = time.perf_counter()
    reply = post(base_url, {**body, "session_id": sid, "leyline": {"mode": arm}})
    latency = time.perf_counter() - started
    client.delete_session(sid)
    return {"latency_s": latency, "computed": reply["leyline"]["prefilled_tokens"],
            "prompt": reply["usage"]["prompt_tokens"], "outcomes": reply["leyline"]["outcomes"]}


def _rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


# -- trace replay -------------------------------------------------------------------------------

def _replay(client, base_url: str, renderer, path: str, limit: int | None, max_turns: int | None,
            per_pattern: int | None) -> dict:
    from ..agent.replay import load_traces

    traces = load_traces(path, limit, max_turns)
    if per_pattern:
        kept, seen = [], {}
        for trace in traces:
            seen[trace["pattern"]] = seen.get(trace["pattern"], 0) + 1
            if seen[trace["pattern"]] <= per_pattern:
                kept.append(trace)
        traces = kept
    totals = {"prompt": 0, "vllm_cached": 0, "leyline_cached": 0, "vllm_prefix_bound": 0}
    per_trace = []
    for trace in traces:
        sid = f"replay-{trace['name']}-{time.monotonic_ns()}"
        row = {"name": trace["name"], "pattern": trace["pattern"], "turns": len(trace["turns"]), "prompt": 0, "vllm_cached": 0,
               "leyline_cached": 0, "vllm_prefix_bound": 0}
        previous: list[int] | None = None
        for turn in trace["turns"]:
            messages = api_layout([Message.model_validate(m) for m in turn])
            ids = renderer.ids(messages, generation_prompt=True)
            plain = complete(base_url, ids, f"plain-{sid}")  # its own earlier turns only, as the session's
            bound = post(base_url, {"model": MODEL, "messages": [m.model_dump(exclude_none=True) for m in messages],
                                     "max_tokens": 1, "temperature": 0, "session_id": sid})
            assert bound["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] == len(ids)
            row["prompt"] += len(ids)
            row["vllm_cached"] += cached(plain["usage"])
            row["leyline_cached"] += bound["usage"]["prompt_tokens_details"]["cached_tokens"]
            row["vllm_prefix_bound"] += _block_prefix(previous, ids)
            previous = ids
        client.delete_session(sid)
        per_trace.append(row)
        for k in totals:
            totals[k] += row[k]
    hit = {k: totals[k] / totals["prompt"] if totals["prompt"] else None
           for k in ("vllm_cached", "leyline_cached", "vllm_prefix_bound")}
    return {"traces": per_trace, "totals": totals, "hit_rate": hit}


def _block_prefix(previous: list[int] | None, ids: list[int], block: int = 16) -> int:
    """Tokens vLLM's prefix cache could serve: the common prefix with the previous turn, whole blocks,
    at most all but the last token (computed, not measured: an upper bound for a warm cache)."""
    if not previous:
        return 0
    n = 0
    for a, b in zip(previous, ids):
        if a != b:
            break
        n += 1
    n = min(n, len(ids) - 1)
    return n - n % block


def prefix_cache_disabled(log: str) -> bool:
    """vLLM logs this when its CPU MLA backend (no AMX) switches prefix caching off."""
    return "forcing chunked prefill and prefix caching to be disabled" in log


# -- report ---------------------------------------------------------------------------------------

def _markdown(result: dict) -> str:
    m = result["model"]
    lines = [f"Model: random {m['family']} at shape {m['shape']} ({m['parameters'] / 1e6:.0f}M parameters). "
             f"Load average before / after: {_loads(result['load_average_before'])} / "
             f"{_loads(result['load_average_after'])}.", ""]
    e = result.get("engine")
    if e:
        lines += [f"vLLM {'CPU build (vllm-cpu)' if e['vllm_on_cpu'] else 'CUDA'}, {e['dtype']}, AMX: "
                  f"{'yes' if e['amx'] else 'no'}; vLLM's prefix cache: "
                  f"{'on' if e['vllm_prefix_cache'] else 'off (vLLM disables it for MLA on CPUs without AMX)'}. "
                  f"KV block size: {e.get('block_size', 'vLLM default')}. Server start {e['startup_s']:.0f} s.", ""]
    if "edits" in result:
        lines += _edits_markdown(result["edits"], e["vllm_prefix_cache"])
    if "shared" in result:
        lines += shared_markdown(result["shared"])
    if "replay" in result:
        lines += _replay_markdown(result["replay"], e["vllm_prefix_cache"])
    if "tax" in result:
        lines += tax_markdown(result["tax"])
    return "\n".join(lines)


def _loads(loads: list[float]) -> str:
    return " ".join(f"{x:.1f}" for x in loads)


def _edits_markdown(edits: list[dict], prefix_cache: bool) -> list[str]:
    rows = []
    for c in edits:
        for arm in ("amortize", "forget", "vllm_resend"):
            a = c[arm]
            rows.append([f"{c['position']:.0%}", c["history_tokens"], arm, a["latency_s"] * 1000,
                         a["computed_tokens"], a["prompt_tokens"], a.get("speedup_vs_resend")])
    return ["## Edit one tool output at 10/50/90% of the history (one output token: latency = TTFT)", "",
            md_table(["edit at", "history", "arm", "TTFT ms (median)", "computed tokens", "prompt tokens",
                      "speed-up vs resend"], rows), "",
            "The resend is warmed with the unedited prompt under a salt of its own, so vLLM's prefix cache "
            "serves it the prefix before the edit and nothing else." if prefix_cache else
            "vLLM's prefix cache is off here: the resend computes every prompt token (no warm-up is sent).", ""]


def _replay_markdown(r: dict, prefix_cache: bool) -> list[str]:
    by_pattern: dict[str, dict] = {}
    for row in r["traces"]:
        acc = by_pattern.setdefault(row["pattern"], {"traces": 0, "prompt": 0, "vllm_cached": 0, "leyline_cached": 0})
        acc["traces"] += 1
        for k in ("prompt", "vllm_cached", "leyline_cached"):
            acc[k] += row[k]
    rows = [[p, a["traces"], a["prompt"], a["vllm_cached"] / a["prompt"], a["leyline_cached"] / a["prompt"]]
            for p, a in by_pattern.items()]
    hit = r["hit_rate"]
    rows.append(["all", len(r["traces"]), r["totals"]["prompt"], hit["vllm_cached"], hit["leyline_cached"]])
    lines = ["## Replay of the shipped agent traces (arms isolated: each trace's plain arm has its own salt)", "",
             md_table(["pattern", "traces", "prompt tokens", "plain vLLM cache hit", "Leyline amortize cache hit"],
                      rows), "",
             f"Plain vLLM with a warm prefix cache could at most serve {hit['vllm_prefix_bound']:.1%} "
             "(block-aligned common prefix with the previous turn, computed).", ""]
    if not prefix_cache:
        lines += ["On this CPU vLLM runs without its prefix cache, so the plain arm recomputes the whole prompt.", ""]
    return lines


def _plot(out: Path, result: dict) -> None:
    from ..common.plots import grouped_bars

    if "edits" in result:
        groups = [f"{c['position']:.0%} of {c['history_tokens']}" for c in result["edits"]]
        grouped_bars(out / "vllm_ttft.png", f"Time to first token after one edit ({result['model']['shape']})",
                     groups, {arm: [c[arm]["latency_s"] * 1000 for c in result["edits"]]
                              for arm in ("amortize", "forget", "vllm_resend")}, "ms")
    if "tax" in result:
        streams = list(result["tax"]["streams"])
        grouped_bars(out / "vllm_tax.png", "Requests without Leyline parameters: tokens/s (median)",
                     [f"{n} stream(s)" for n in streams],
                     {arm: [result["tax"]["streams"][n][arm]["median"] for n in streams]
                      for arm in ("plain", "plugin")}, "tokens/s")
        if all("cpu_s_per_request" in result["tax"]["streams"][n] for n in streams):
            grouped_bars(out / "vllm_tax_cpu.png", "Server CPU time per request, no Leyline parameters "
                         "(median)", [f"{n} stream(s)" for n in streams],
                         {arm: [result["tax"]["streams"][n]["cpu_s_per_request"][arm]["median"] * 1000
                                for n in streams] for arm in ("plain", "plugin")}, "CPU ms / request")
