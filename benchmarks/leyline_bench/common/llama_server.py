"""Start llama.cpp's ``llama-server`` (built by ``make llama-server``) as a subprocess on 127.0.0.1.

The peer a user without Leyline would pick on a CPU: one slot (``-np 1``), its cache reuse on
(``--cache-reuse 256``: chunks of at least 256 tokens found again after an edit are shifted in
place, the K-shift being the same RoPE rotation amortize applies) and its host-RAM prompt cache
off (``--cache-ram 0``), so what the slot's KV holds is all it reuses. Prompts are token ids.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from leyline_testkit.ports import free_port

LLAMA_SERVER = Path(__file__).resolve().parents[3] / ".llama.cpp" / "bin" / "llama-server"
CACHE_REUSE = 256


def absent_reason() -> str | None:
    """Why the peer cannot run here, or None."""
    return None if LLAMA_SERVER.is_file() else f"{LLAMA_SERVER} is absent (make llama-server builds it)"


class LlamaServer:
    """``with LlamaServer(gguf, workdir, ctx=8192) as server: server.complete(ids, n_predict=1)``."""

    def __init__(self, gguf: Path, workdir: Path, *, ctx: int, threads: int = 2):
        self.gguf, self.workdir = Path(gguf), Path(workdir)
        self.port = free_port()
        self.cmd = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                    "-c", str(ctx), "-np", "1", "--cache-reuse", str(CACHE_REUSE), "--cache-ram", "0",
                    "-t", str(threads), "-tb", str(threads)]
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / "llama-server.log"
        started = time.perf_counter()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=3600)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {log_path.read_text()[-3000:]}")
            try:
                if self.http.get("/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > 600:
                self.stop()
                raise TimeoutError("llama-server did not become healthy in 600 s")
            time.sleep(0.5)
        self.startup_s = time.perf_counter() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=60)

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def complete(self, prompt: list[int] | str, *, n_predict: int, cache_prompt: bool = True,
                 ignore_eos: bool = False) -> dict:
        """Greedy ``/completion`` of ``prompt``; the reply with its ``tokens`` and ``timings``
        (``prompt_n``: prompt tokens computed, ``cache_n``: reused from the slot)."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": cache_prompt,
                "return_tokens": True, "ignore_eos": ignore_eos}
        r = self.http.post("/completion", json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"/completion answered {r.status_code}: {r.text[:2000]}")
        return r.json()
