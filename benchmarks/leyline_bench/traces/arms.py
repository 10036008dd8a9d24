"""The engines a replay is measured on, each on a server of its own, driven over HTTP only.

Every arm answers ``turn(history)`` with one model call of ``max_tokens=1`` (its latency is the
time to first token) and reports the prompt tokens the engine computed for it:

* ``vllm_plain``: ``vllm serve`` without the plugin, its prefix cache on. The prompt is the token
  ids the plugin's chat template builds (``ChatRenderer``), sent to ``/v1/completions``, so both
  vLLM arms compute over the same ids; computed = ``prompt_tokens - cached_tokens``.
* ``leyline_amortize`` / ``leyline_auto``: ``vllm serve`` with the plugin; the session-bound
  ``/v1/chat/completions`` (``session_id``, ``leyline.mode``); computed = the ``leyline`` report's
  ``prefilled_tokens`` (every engine request of the turn: replacement prefills, auto's window).
* ``llama_cpp``: ``llama-server --cache-reuse 256 --cache-ram 0 -np 1`` on a GGUF, the same ids
  sent to its ``/completion``; computed = ``timings.prompt_n``, its prefill time ``timings.prompt_ms``.
* ``runtime``: ``leyline-runtime serve`` (the bundled runtime, its own MLA model and tokenizer),
  the bound ``/v1/chat/completions``; for a policy with ``context_management`` it is sent the raw
  history with that field and the server edits it. Tokens only: another model, another tokenizer.

vLLM arms also report the engine's prefill seconds for the turn (``vllm:request_prefill_time_seconds``
from ``/metrics``, summed over the turn's engine requests).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .turns import wire
from ..common.llama_server import LlamaServer
from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer

ARMS = ("vllm_plain", "leyline_amortize", "leyline_auto", "llama_cpp", "runtime")
PREFILL_METRIC = "vllm:request_prefill_time_seconds_sum"
VLLM_BLOCK_SIZE = 32  # the vLLM arms' --block-size; traces' arithmetic prefix cache counts in it


@dataclass
class TurnResult:
    computed: int
    prompt: int
    latency_s: float
    prefill_s: float | None = None
    extra: dict = field(default_factory=dict)


def post(client: httpx.Client, path: str, body: dict) -> dict:
    r = client.post(path, json=body)
    if r.status_code >= 400:
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:2000]}")
    return r.json()


def _cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


class VllmArm:
    """Plain vLLM, or Leyline on vLLM in one mode (``mode`` None: plain)."""

    def __init__(self, name: str, checkpoint: Path, workdir: Path, renderer, *, mode: str | None,
                 kv_gib: int, max_model_len: int, block_size: int = VLLM_BLOCK_SIZE, memory_gib: float = 2.0):
        self.name, self.mode, self.renderer = name, mode, renderer
        self.memory_gib = memory_gib  # what the server takes: fp32 weights, its KV cache, the rest
        self.server = VllmServer(checkpoint, workdir, plugin=mode is not None, max_model_len=max_model_len,
                                 block_size=block_size,
                                 env={"VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
                                      # a long prefill on a CPU shared with other jobs can pass vLLM's 300 s
                                      "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"})
        self.session: str | None = None

    def start(self) -> None:
        self.server.start()
        self.http = httpx.Client(base_url=self.server.base_url, timeout=3600)
        self.turn([{"role": "user", "content": "warm-up: list the files."}], session_key="warm-up")
        self.end_session()

    def stop(self) -> None:
        self.server.stop()

    def describe(self) -> dict:
        return {"startup_s": self.server.startup_s, "dtype": self.server.dtype, "cmd": self.server.cmd}

    def new_session(self, key: str) -> None:
        self.session = f"{key}-{time.monotonic_ns()}"

    def end_session(self) -> None:
        if self.mode is not None and self.session:
            self.http.delete(f"/sessions/{self.session}")
        self.session = None

    def turn(self, history, *, context_management: dict | None = None, session_key: str | None = None) -> TurnResult:
        from leyline_sdk.protocol import Message

        if session_key is not None:
            self.new_session(session_key)
        messages = [m if isinstance(m, Message) else Message.model_validate(m) for m in history]
        before = self._prefill_seconds()
        started = time.perf_counter()
        if self.mode is None:
            ids = self.renderer.ids(messages, generation_prompt=True)
            reply = post(self.http, "/v1/completions", {"model": SERVED_MODEL_NAME, "prompt": ids, "max_tokens": 1,
                                                         "temperature": 0})
            latency = time.perf_counter() - started
            usage = reply["usage"]
            result = TurnResult(usage["prompt_tokens"] - _cached(usage), usage["prompt_tokens"], latency)
        else:
            reply = post(self.http, "/v1/chat/completions", {
                "model": SERVED_MODEL_NAME, "messages": wire(messages), "max_tokens": 1, "temperature": 0,
                "session_id": self.session, "leyline": {"mode": self.mode}})
            latency = time.perf_counter() - started
            report = reply["leyline"]
            result = TurnResult(report["prefilled_tokens"], reply["usage"]["prompt_tokens"], latency,
                                extra={"outcomes": _outcomes(report), "rebuilt": report.get("rebuilt")})
        result.prefill_s = self._prefill_seconds() - before
        return result

    def _prefill_seconds(self) -> float:
        text = self.http.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(PREFILL_METRIC))


def _outcomes(report: dict) -> list[dict]:
    """What each directive of the turn did, in short (the full report is too long to keep per turn)."""
    keep = ("applied_mode", "fallback_reason", "reused_tokens", "rotated_tokens", "recomputed_tokens")
    out = []
    for o in report.get("outcomes") or []:
        row = {k: o.get(k) for k in keep if o.get(k) is not None}
        auto = o.get("auto") or {}
        if auto:
            keys = ("choice", "repaired_tokens", "drift_repair_tokens", "signal_tokens")
            row["auto"] = {k: auto.get(k) for k in keys}
        out.append(row)
    return out


class LlamaCppArm:
    """``llama-server`` on one slot (:mod:`..common.llama_server`): what the slot's KV holds is all it reuses."""

    name = "llama_cpp"

    def __init__(self, gguf: Path, workdir: Path, renderer, *, ctx: int, threads: int = 2):
        self.renderer = renderer
        self.memory_gib = Path(gguf).stat().st_size / 2**30 + 1.0
        self.server = LlamaServer(gguf, workdir, ctx=ctx, threads=threads)

    def start(self) -> None:
        self.server.start()
        # text, not the chat template: a warm-up sharing the template's first tokens would serve the first call
        self.server.complete("warm-up: list the files.", n_predict=1)

    def stop(self) -> None:
        self.server.stop()

    def describe(self) -> dict:
        return {"startup_s": self.server.startup_s, "cmd": self.server.cmd}

    def new_session(self, key: str) -> None:
        pass  # one slot: a session simply follows the previous one (its common prefix is reused, as in use)

    def end_session(self) -> None:
        pass

    def turn(self, history, *, context_management: dict | None = None, session_key: str | None = None) -> TurnResult:
        from leyline_sdk.protocol import Message

        messages = [m if isinstance(m, Message) else Message.model_validate(m) for m in history]
        ids = self.renderer.ids(messages, generation_prompt=True)
        started = time.perf_counter()
        reply = self.server.complete(ids, n_predict=1)
        latency = time.perf_counter() - started
        t = reply["timings"]
        return TurnResult(t["prompt_n"], t["prompt_n"] + t["cache_n"], latency, prefill_s=t["prompt_ms"] / 1000)


class RuntimeArm:
    """The bundled runtime in a child process; its default model, the context limit lifted (``model_folder``)."""

    name = "runtime"
    memory_gib = 2.0

    def __init__(self, model_folder: Path):
        self.model_folder = model_folder
        self.session: str | None = None

    def start(self) -> None:
        from ..common.inproc import serve_in_subprocess

        started = time.perf_counter()
        self._serving = serve_in_subprocess(["--model", str(self.model_folder), "--max-cache-tokens", "131072",
                                             "--threads", "2"])
        base = self._serving.__enter__().url
        self.startup_s = time.perf_counter() - started
        self.http = httpx.Client(base_url=base, timeout=3600)

    def stop(self) -> None:
        self._serving.__exit__(None, None, None)

    def describe(self) -> dict:
        return {"startup_s": self.startup_s, "model": str(self.model_folder)}

    def new_session(self, key: str) -> None:
        self.session = f"{key}-{time.monotonic_ns()}"

    def end_session(self) -> None:
        if self.session:
            self.http.delete(f"/sessions/{self.session}")
        self.session = None

    def turn(self, history, *, context_management: dict | None = None, session_key: str | None = None) -> TurnResult:
        from leyline_sdk.protocol import Message

        messages = [m if isinstance(m, Message) else Message.model_validate(m) for m in history]
        body = {"model": "leyline-default", "messages": wire(messages), "max_tokens": 1, "temperature": 0,
                "session_id": self.session}
        if context_management:
            body["context_management"] = context_management
        started = time.perf_counter()
        reply = post(self.http, "/v1/chat/completions", body)
        latency = time.perf_counter() - started
        edits = (reply.get("context_management") or {}).get("applied_edits") or []
        return TurnResult(reply["leyline"]["prefilled_tokens"], reply["usage"]["prompt_tokens"], latency,
                          extra={"cleared_tool_uses": sum(e["cleared_tool_uses"] for e in edits),
                                 "outcomes": _outcomes(reply["leyline"])})


def runtime_long_context_model(folder: Path, positions: int) -> Path:
    """The bundled default model with ``max_position_embeddings`` raised to ``positions`` (its weights linked,
    not copied): the replayed histories, in this tokenizer's tokens, are longer than its 4096. Token counts do
    not depend on how well it does past its trained length."""
    import leyline_runtime

    source = Path(leyline_runtime.__file__).parent / "default_model"
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("model.safetensors", "tokenizer.json"):
        link = folder / name
        if not link.exists():
            link.symlink_to(source / name)
    return folder
