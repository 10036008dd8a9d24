"""What every result file says about where and how it was measured."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from leyline_testkit.cpu import cpu_isa, cpu_model

REPO_ROOT = Path(__file__).resolve().parents[3]


def machine_info() -> dict:
    return {
        "cpu": cpu_model(),
        "isa": cpu_isa(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _git(*args: str) -> str | None:
    # Read-only queries; GIT_OPTIONAL_LOCKS=0 keeps `status` from touching the index.
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info() -> dict:
    """The checkout's commit; ``LEYLINE_COMMIT`` names it where the tree is a copy whose git
    history is not its own (a tree sent to a GPU machine)."""
    if os.environ.get("LEYLINE_COMMIT"):
        return {"commit": os.environ["LEYLINE_COMMIT"], "dirty": None}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


_COMMAND: list[str] | None = None


def set_command(argv: list[str]) -> None:
    """Record the command line (``main(argv)`` callers are not ``sys.argv``)."""
    global _COMMAND
    _COMMAND = list(argv)


def command_line() -> str:
    argv = _COMMAND if _COMMAND is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
    return shlex.join(argv)


def provenance() -> dict:
    return {"machine": machine_info(), "command": command_line(), "git": git_info()}


def runtime_info(runtime) -> dict:
    """The served model and the runtime settings that shape the numbers."""
    from leyline_runtime.model.default import DEFAULT_MODEL_DIR
    from leyline_runtime.model.layers import linear_library

    cfg, rc = runtime.model.config, runtime.config
    default = rc.model_path is None
    trained = not default or (DEFAULT_MODEL_DIR / "model.safetensors").is_file()
    return {
        "model": rc.model_path or ("embedded default (trained)" if trained else "embedded default (seeded random)"),
        "layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "kv_lora_rank": cfg.kv_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "dtype": rc.dtype, "block_size": rc.block_size, "prefill_chunk": rc.prefill_chunk,
        "max_cache_tokens": rc.max_cache_tokens,
        "cpu_gemm": linear_library(rc.batch_invariant) if rc.device == "cpu" else None,
    }
