"""Run the documents' examples against a real runtime; check or rewrite what they print.

    python -m leyline_bench.serve.docs            # check: exit 1 with a diff when a document is stale
    python -m leyline_bench.serve.docs --write    # rewrite the outputs in place (make docs)

The documents are ``CHECKED_FILES`` (README.md and the docs/ pages that hold examples); each gets
its own fresh runtime, so a page's examples see only that page's sessions.

It starts the runtime in-process on a free 127.0.0.1 port with the defaults of
``leyline-runtime serve --api-key sk-demo`` (embedded default model, float32,
one torch thread), then runs every ````console`` block's ``$ command`` with
bash, in document order, with ``B`` (the base URL), ``AUTH`` (the header),
``LEYLINE_BASE_URL`` and ``LEYLINE_API_KEY`` set, and puts what came back
under it. A ````python`` block right after ``<!-- example: PATH -->`` is the
file at PATH, verbatim. Every example samples greedily (temperature 0), so the
outputs repeat; the values that differ per run anyway (completion ids,
``created`` times, ``elapsed_ms``, Prometheus ``_created`` samples) are
compared as placeholders.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
SOURCE_ROOTS = [REPO_ROOT, *(REPO_ROOT / d for d in ("kernels", "integrations", "benchmarks", "training"))]
API_KEY = "sk-demo"
# Every markdown file whose console outputs and example copies are generated; tests/repo/test_docs.py checks
# that no other document holds a console block or an example copy.
CHECKED_FILES = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "api.md"]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
_EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)^```$", re.S | re.M)
_VOLATILE = [
    (re.compile(r"chatcmpl-[0-9a-f]+"), "chatcmpl-<id>"),
    (re.compile(r"call_[0-9a-f]{12}_"), "call_<id>_"),  # tool-call ids are random (unique per thread)
    (re.compile(r'("created": ?)\d+'), r"\1<time>"),
    (re.compile(r'("elapsed_ms": ?)[0-9.e+-]+'), r"\1<ms>"),
    (re.compile(r"^(\w+_created(?:\{[^}]*\})?) \S+$", re.M), r"\1 <time>"),
]


def normalized(text: str) -> str:
    """``text`` with the values that differ from run to run replaced by placeholders."""
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def regenerate(text: str, run: Callable[[str], str]) -> str:
    """``text`` with each console block's outputs replaced by ``run(command)`` and each example re-read."""
    text = _EXAMPLE.sub(lambda m: f"<!-- example: {m[1]} -->\n```python\n{(REPO_ROOT / m[1]).read_text()}```",
                        text)

    def console(match: re.Match[str]) -> str:
        if match[1] != "console":
            return match[0]
        lines = []
        for command in re.findall(r"^\$ (.*)$", match[2], re.M):
            lines.append(f"$ {command}")
            output = run(command).rstrip("\n")
            lines += [output] if output else []
        return "```console\n" + "\n".join(lines) + "\n```"

    return _FENCE.sub(console, text)


class Runner:
    """Runs README commands against ``base_url``, the way a reader would in a shell."""

    def __init__(self, base_url: str):
        path = os.environ.get("PYTHONPATH", "")
        self.env = {**os.environ, "B": base_url, "AUTH": f"Authorization: Bearer {API_KEY}",
                    "LEYLINE_BASE_URL": base_url, "LEYLINE_API_KEY": API_KEY,
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join([*map(str, SOURCE_ROOTS), *([path] if path else [])])}

    def __call__(self, command: str) -> str:
        result = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=self.env, capture_output=True,
                                text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"README command failed ({result.returncode}): {command}\n{result.stderr}")
        return result.stdout


def generate(path: Path) -> str:
    """``path`` (a markdown file) with fresh outputs from a runtime started for the purpose."""
    import torch

    from leyline_runtime.runtime import RuntimeConfig

    from ..common.inproc import serve_in_thread

    torch.set_num_threads(1)  # one thread: the same reduction order, the same greedy tokens
    with serve_in_thread(RuntimeConfig(api_keys=[API_KEY])) as base_url:
        return regenerate(path.read_text(), Runner(base_url))


def check(path: Path, write: bool) -> bool:
    """Regenerate ``path``; rewrite it (``write``) or report whether it is current."""
    fresh = generate(path)
    if write:
        path.write_text(fresh)
        print(f"wrote {path}")
        return True
    old, new = normalized(path.read_text()), normalized(fresh)
    if old == new:
        print(f"{path}: every example output is current")
        return True
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), "fresh run"))
    print(f"\n{path} is stale: run `make docs` (python -m leyline_bench.serve.docs --write)", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m leyline_bench.serve.docs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the files instead of checking them")
    ap.add_argument("--file", action="append", type=Path,
                    help="one markdown file (repeatable; default: every file in CHECKED_FILES)")
    args = ap.parse_args(argv)
    results = [check(path, args.write) for path in args.file or CHECKED_FILES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
