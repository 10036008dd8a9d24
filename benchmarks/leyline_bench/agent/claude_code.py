"""``leyline-bench claude-code``: Claude Code (``@anthropic-ai/claude-code``, ``claude -p``) on a real model
served by ``vllm serve``: what it sends, whether a task's tool round trip completes, and what the engine
computed for it.

Each arm runs on a server of its own (no arm warms another's cache), the same weights, a 32k context
(Claude Code's first request is ~11-15k tokens), vLLM's ``hermes`` tool parser (Qwen2.5's tool calls):

* ``leyline``: ``vllm serve`` with the plugin; Claude Code sends ``X-Leyline-Session`` (through its
  ``ANTHROPIC_CUSTOM_HEADERS``), so each of its calls is the plugin's bound Messages turn on one session
  (without the header the plugin now finds that session by the history each call continues: the
  header keeps the binding independent of that rule, so a miss there cannot pass for a result);
* ``vllm``: plain ``vllm serve`` (no plugin), Claude Code on vLLM's own ``/v1/messages``.

Claude Code talks to the server through :class:`~..common.recording_proxy.RecordingProxy`, which writes
down each request (headers, body) and each answer's status (and text, when not a 2xx). The task runs in a
scratch folder holding ``hello.py``; ``--output-format stream-json`` gives the transcript (the tool calls,
their results, the final text). The engine's computed prompt tokens are vLLM's own count
(``vllm:request_prefill_kv_computed_tokens``: prefill rows computed, cached and loaded ones excluded),
read from ``/metrics`` before and after.

    .venv-vllm/bin/leyline-bench claude-code --model qwen2.5-coder-1.5b-instruct --out docs/perf/claude_code

Claude Code is taken from ``--claude``, else ``claude`` on PATH, else installed with npm
(``@anthropic-ai/claude-code@CLAUDE_CODE_VERSION``) into ``~/.cache/leyline/claude-code``. It is run
with its telemetry and non-essential traffic off and ``HOME`` in a scratch folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from leyline_testkit.ports import free_port
from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer, real_weights_dtype

from ..common.output import md_table, write_results
from ..common.recording_proxy import RecordingProxy

NAME = "claude_code"
CLAUDE_CODE_VERSION = "2.1.328"
KEY = "sk-bench"
TASK = "Run hello.py with python3 and tell me what it prints."
HELLO = 'print("leyline says hello")\n'
ARMS = ("leyline", "vllm")
COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"
PREFILL_S = "vllm:request_prefill_time_seconds_sum"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME.replace("_", "-"))
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a checkpoint of leyline_bench.weights")
    p.add_argument("--arms", type=lambda t: t.split(","), default=list(ARMS), help="comma list of leyline, vllm")
    p.add_argument("--task", default=TASK, help="the prompt given to claude -p (in a folder holding hello.py)")
    p.add_argument("--claude", default=None, help="the claude executable (default: PATH, else npm install)")
    p.add_argument("--max-model-len", type=int, default=32768, help="the served context (tokens)")
    p.add_argument("--max-output-tokens", type=int, default=1024,
                   help="Claude Code's own cap on a reply (CLAUDE_CODE_MAX_OUTPUT_TOKENS; it asks 32000 otherwise)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one claude -p run may take")
    p.set_defaults(run=run, quick_overrides={"model": "qwen2.5-coder-0.5b-instruct", "arms": ["leyline"]})


def claude_executable(given: str | None) -> list[str]:
    if given:
        return [given]
    if shutil.which("claude"):
        return ["claude"]
    prefix = Path.home() / ".cache" / "leyline" / "claude-code"
    wrapper = prefix / "node_modules" / "@anthropic-ai" / "claude-code" / "cli-wrapper.cjs"
    if not wrapper.is_file():
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                        f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"], check=True)
    # the wrapper finds the platform's native binary (npm may not run the package's postinstall)
    return ["node", str(wrapper)]


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def what_was_sent(exchanges) -> dict:
    """The first Messages request's headers and fields, as far as they say what the client expects."""
    first = next((e for e in exchanges if e.path == "/v1/messages" and isinstance(e.body, dict)), None)
    if first is None:
        return {}
    h, b = first.headers, first.body
    tools = b.get("tools") or []
    return {
        "query": first.query,
        "user_agent": h.get("user-agent"),
        "anthropic_version": h.get("anthropic-version"),
        "anthropic_beta": sorted((h.get("anthropic-beta") or "").split(",")),
        "auth": "x-api-key" if "x-api-key" in h else "authorization" if "authorization" in h else None,
        "headers": sorted(k for k in h if k.startswith(("x-claude", "x-app", "anthropic-dangerous"))),
        "fields": sorted(b),
        "max_tokens": b.get("max_tokens"), "stream": b.get("stream"), "thinking": b.get("thinking"),
        "output_config": b.get("output_config"), "context_management": b.get("context_management"),
        "metadata_user_id_keys": sorted(json.loads(b["metadata"]["user_id"])) if _json_user_id(b) else None,
        "message_roles": [m.get("role") for m in b.get("messages") or []],
        "system_blocks": len(b.get("system") or []),
        "tools": len(tools), "deferred_tools": sum(bool(t.get("defer_loading")) for t in tools),
        "body_bytes": len(json.dumps(b)),
    }


def _json_user_id(body: dict) -> bool:
    try:
        return isinstance(json.loads((body.get("metadata") or {}).get("user_id") or ""), dict)
    except ValueError:
        return False


def transcript(lines: list[str]) -> dict:
    """Claude Code's stream-json events in short: tool calls, their results, the final result."""
    calls, results, final = [], [], {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        content = (event.get("message") or {}).get("content") or []
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                calls.append({"name": block.get("name"), "input": json.dumps(block.get("input"))[:200]})
            elif block.get("type") == "tool_result":
                text = block.get("content")
                text = text if isinstance(text, str) else json.dumps(text)
                results.append({"is_error": bool(block.get("is_error")), "content": text[:200]})
        if event.get("type") == "result":
            final = {k: event.get(k) for k in ("subtype", "is_error", "num_turns", "duration_ms")}
            final["result"] = (event.get("result") or "")[:300]
            final["usage"] = {k: v for k, v in (event.get("usage") or {}).items() if isinstance(v, int)}
    round_trip = any(not r["is_error"] for r in results) and bool(calls)
    return {"tool_calls": calls, "tool_results": results, "tool_round_trip": round_trip, **final}


def run_arm(arm: str, folder: Path, args, claude: list[str], work: Path) -> dict:
    plugin = arm == "leyline"
    extra = ["--api-key", KEY, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    # a long prompt on a small CPU: one engine step may take minutes (vLLM's default allows 300 s)
    env = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600", "VLLM_CPU_KVCACHE_SPACE": "2"}
    with VllmServer(folder, work / f"serve-{arm}", dtype=real_weights_dtype(), max_model_len=args.max_model_len,
                    plugin=plugin, extra=extra, env=env) as srv, RecordingProxy(srv.base_url, free_port()) as proxy:
        task_dir = work / f"task-{arm}"
        task_dir.mkdir()
        (task_dir / "hello.py").write_text(HELLO)
        (home := work / f"home-{arm}").mkdir()
        run_env = {**os.environ, "ANTHROPIC_BASE_URL": proxy.base_url, "HOME": str(home),
                   "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                   "DISABLE_AUTOUPDATER": "1", "API_TIMEOUT_MS": str(int(args.timeout * 1000)),
                   "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(args.max_output_tokens)}
        # Claude Code sends ANTHROPIC_API_KEY as x-api-key, which the plugin takes on the Messages paths;
        # plain vLLM's --api-key check reads only Authorization (measured: 401 on every call), so that arm
        # gets the key as ANTHROPIC_AUTH_TOKEN, which Claude Code sends as a Bearer token
        run_env["ANTHROPIC_API_KEY" if plugin else "ANTHROPIC_AUTH_TOKEN"] = KEY
        if plugin:
            run_env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Leyline-Session: claude-code-{int(time.time())}"
        computed0, prefill0 = _metric(srv.base_url, COMPUTED), _metric(srv.base_url, PREFILL_S)
        started = time.perf_counter()
        done = subprocess.run([*claude, "-p", args.task, "--model", SERVED_MODEL_NAME, "--allowedTools",
                               "Bash(python3:*)", "--output-format", "stream-json", "--verbose"],
                              cwd=task_dir, env=run_env, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - started
        statuses = [e.status for e in proxy.exchanges]
        return {
            "arm": arm, "exit_code": done.returncode, "wall_s": wall,
            "requests": len(proxy.exchanges), "statuses": statuses,
            "errors": sorted({(e.error or "")[:300] for e in proxy.exchanges if e.error}),
            "computed_prompt_tokens": _metric(srv.base_url, COMPUTED) - computed0,
            "prefill_s": _metric(srv.base_url, PREFILL_S) - prefill0,
            "sent": what_was_sent(proxy.exchanges),
            "stderr_tail": re.sub(r"\s+", " ", done.stderr[-400:]),
            **transcript(done.stdout.splitlines()),
        }


def run(args) -> dict:
    from leyline_bench.weights import hf_folder

    folder = hf_folder(args.model)
    claude = claude_executable(args.claude)
    version = subprocess.run([*claude, "--version"], capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="leyline-bench-claude-code-"))
    arms = [run_arm(arm, folder, args, claude, work) for arm in args.arms]
    result = {"benchmark": NAME, "model": args.model, "claude_code": version, "task": args.task,
              "max_output_tokens": args.max_output_tokens, "arms": arms}
    return write_results(args.out, NAME, result, "Claude Code on a real model through vllm serve", markdown(result))


def markdown(result: dict) -> str:
    rows = [[a["arm"], a["requests"], " ".join(map(str, a["statuses"])), a["tool_round_trip"],
             len(a["tool_calls"]), a.get("num_turns"), a["computed_prompt_tokens"], a["prefill_s"], a["wall_s"]]
            for a in result["arms"]]
    table = md_table(["arm", "requests", "statuses", "tool round trip", "tool calls", "turns",
                      "prompt tokens computed", "prefill s", "wall s"], rows)
    parts = [f"Claude Code `{result['claude_code']}` on `{result['model']}`, task: \"{result['task']}\"\n", table]
    for a in result["arms"]:
        parts.append(f"\n## {a['arm']}\n\nFinal text (first 300 characters): `{(a.get('result') or '')!r}`\n")
        if a["tool_calls"]:
            parts.append("Tool calls: " + "; ".join(f"`{c['name']}` {c['input']}" for c in a["tool_calls"]) + "\n")
        if a["errors"]:
            parts.append("Answers that were not 2xx: " + "; ".join(f"`{e}`" for e in a["errors"]) + "\n")
    sent = next((a["sent"] for a in result["arms"] if a["sent"]), {})
    parts.append("\n## What Claude Code sent (its first request)\n\n```json\n" + json.dumps(sent, indent=1) + "\n```\n")
    return "\n".join(parts)
