"""Test set-up shared by every module.

TRITON_INTERPRET must be set before triton is imported (triton has no CPU backend otherwise).
The checkout's own packages go first on sys.path (and on PYTHONPATH for subprocesses), so the
suite always tests the tree it lives in, also from a second git worktree that shares one venv.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SOURCE_ROOTS = [ROOT, ROOT / "kernels", ROOT / "integrations", ROOT / "benchmarks", ROOT / "training", ROOT / "testkit"]

for path in [TESTS, *SOURCE_ROOTS]:
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(p) for p in SOURCE_ROOTS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

# tests/vllm needs vLLM's own environment (.venv-vllm): `make test-vllm` runs it, the main suite skips the folder.
collect_ignore = [] if os.environ.get("LEYLINE_VLLM_TESTS") == "1" else ["vllm"]
