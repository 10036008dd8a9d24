"""Finished arms of an agent run, kept on disk so ``--resume`` can skip them.

A real model's arm takes tens of minutes on a small CPU; a run that dies in its third arm keeps
the first two, and a finished run can be given another arm without running the others again. The
file (``<out>/agent.partial.samples.json.gz``, ignored by git like every raw samples file) holds
each finished arm's records and server report, keyed by the settings that decide them; ``--resume``
takes an arm from it only when those settings are the same.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SETTINGS_KEYS = ("engine", "model", "dtype", "block_size", "tasks", "start", "kinds", "max_tokens", "max_calls",
                 "system_prompt")


def checkpoint_path(out: str | Path) -> Path:
    return Path(out) / "agent.partial.samples.json.gz"


def settings_key(args) -> dict:
    return {k: getattr(args, k, None) for k in SETTINGS_KEYS}


def load_finished(args) -> dict[str, dict]:
    """``arm -> {"records": [...], "server": {...}}`` saved by an earlier run with these settings."""
    path = checkpoint_path(args.out)
    if not getattr(args, "resume", False) or not path.is_file():
        return {}
    saved = json.loads(gzip.decompress(path.read_bytes()))
    return saved["arms"] if saved.get("settings") == settings_key(args) else {}


def save_finished(args, arms: dict[str, dict]) -> None:
    path = checkpoint_path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps({"settings": settings_key(args), "arms": arms}).encode()))

