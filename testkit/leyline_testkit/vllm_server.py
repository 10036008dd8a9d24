"""Start ``vllm serve`` with Leyline's plugins as a subprocess on 127.0.0.1 (tests and bench).

The command line is the one docs/vllm.md documents. CPU-only workarounds
(the rotary custom op, the KV cache size) are applied only when vLLM runs on
the CPU build, so the same flags serve official CUDA vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .cpu import has_amx, has_native_bf16
from .ports import free_port

SERVED_MODEL_NAME = "leyline-tiny"  # what the tests and benches ask for, whichever checkpoint is served
# vLLM's CPU build reserves one more core per rank (for NIXL) whenever any KV connector is configured;
# on a small CPU that leaves none for the scheduler and API processes, and the worker's OMP threads then
# contend with them (measured: -72% tokens/s at one stream on 2 cores). Leyline's connector copies
# rows in the worker's own step and needs no core: reserve what plain vLLM reserves (one per rank).
CPU_RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
CONNECTOR_CONFIG = {"kv_connector": "LeylineConnector", "kv_role": "kv_both",
                    "kv_load_failure_policy": "recompute"}


def vllm_on_cpu() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
        return True
    except PackageNotFoundError:
        return False


def default_dtype() -> str:
    """The dtype ``VllmServer`` serves without one named: bf16 where vLLM's CPU build has AMX (its AMX
    attention backends take only bf16), else fp32 (vLLM's CPU attention keeps fp32 caches fast)."""
    return "bfloat16" if vllm_on_cpu() and has_amx() else "float32"


def real_weights_dtype() -> str:
    """The dtype a real bf16 checkpoint is served in: bf16, except where vLLM runs on a CPU that only
    emulates it (no AVX512-BF16, no AMX), where fp32 is the fast one. Measured on a 2-core AVX2-only AMD
    EPYC: one real edit of ``drift-real --vllm`` took 580 s in bf16 and 148 s in fp32."""
    return "float32" if vllm_on_cpu() and not has_native_bf16() else "bfloat16"


def serve_command(model: str | Path, port: int, *, dtype: str, max_model_len: int = 4096,
                  block_size: int | None = None, python: str = sys.executable, extra: list[str] | None = None,
                  plugin: bool = True) -> list[str]:
    """``plugin=False``: the same server without Leyline (no connector, no worker extension);
    ``block_size`` None: vLLM's default (32 on an AMX CPU, below)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--max-model-len", str(max_model_len), "--served-model-name", SERVED_MODEL_NAME,
           "--enable-prompt-tokens-details"]
    if plugin:
        cmd += ["--kv-transfer-config", json.dumps(CONNECTOR_CONFIG),
                "--worker-extension-cls", "leyline_vllm.kv.worker_extension.LeylineWorkerExtension"]
    if vllm_on_cpu():
        # vLLM's CPU rotary op rotates 3-D queries wrongly; eager mode skips a slow compile on small CPUs.
        cmd += ["-cc", json.dumps({"custom_ops": ["all", "-rotary_embedding"]}), "--enforce-eager"]
        if has_amx() and block_size is None:
            # AMX_MLA takes blocks of any multiple of 32 and defaults to 128 here: 32 lets the short
            # agent histories of the tests and benches span several blocks (prefix reuse + rotation)
            cmd += ["--block-size", "32"]
    if block_size is not None:
        cmd += ["--block-size", str(block_size)]
    return cmd + list(extra or [])


class VllmServer:
    """``with VllmServer(model, workdir) as server: httpx.get(server.base_url + ...)``.

    ``plugin=False`` starts plain ``vllm serve`` on the same flags, with no plugin loaded at all
    (``VLLM_PLUGINS=""`` matches none)."""

    def __init__(self, model: str | Path, workdir: str | Path, *, env: dict[str, str] | None = None,
                 extra: list[str] | None = None, startup_timeout: float = 900.0, plugin: bool = True,
                 dtype: str | None = None, max_model_len: int = 4096, block_size: int | None = None):
        self.model = Path(model)
        self.workdir = Path(workdir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.dtype = dtype or default_dtype()  # ``dtype`` forces one (a bf16 check anywhere)
        self.plugin = plugin
        self.cmd = serve_command(model, self.port, dtype=self.dtype, max_model_len=max_model_len,
                                 block_size=block_size, extra=extra, plugin=plugin)
        self.env = {**os.environ, "VLLM_PLUGINS": "leyline" if plugin else "",
                    "VLLM_CACHE_ROOT": str(self.workdir / "vllm-cache"),
                    "TORCHINDUCTOR_CACHE_DIR": str(self.workdir / "inductor-cache"),
                    "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
        if plugin and vllm_on_cpu():
            self.env.setdefault(CPU_RESERVED_ENV, "1")  # tensor parallel 1: plain vLLM's reservation
        self.startup_timeout = startup_timeout
        self.log_path = self.workdir / "vllm-serve.log"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        started = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_healthy(started)
        except BaseException:  # a failed or interrupted start leaves no server behind (no __exit__ runs)
            self.stop()
            raise

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.startup_timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    self.startup_s = time.perf_counter() - started
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vllm serve did not become healthy in {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()  # a paused server cannot act on SIGTERM
        os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the engine and worker processes too
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """Stop every process of the server (SIGSTOP): it keeps its memory and uses no CPU."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
