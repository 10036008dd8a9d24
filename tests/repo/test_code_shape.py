"""The code stays in readable pieces: no function over 80 lines, no module over 400 lines, and no import
list folded to stay under that (one name per line once an import spans several lines).

Counted from the source (ast), over every package of ours. Data catalogues (tables of
task kinds, trace data) are the one listed exception: their length is data, not logic.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [ROOT, ROOT / "kernels", ROOT / "integrations", ROOT / "benchmarks", ROOT / "training", ROOT / "testkit"]
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
DATA_CATALOGUES: set[str] = set()


def our_modules() -> list[Path]:
    return sorted(p for root in SOURCE_ROOTS for pkg in root.glob("leyline_*") if pkg.is_dir()
                  for p in pkg.rglob("*.py"))


def test_no_function_is_over_80_lines():
    long = []
    for path in our_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_no_module_is_over_400_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in our_modules()
            if str(p.relative_to(ROOT)) not in DATA_CATALOGUES
            and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == []


def test_no_import_list_is_folded():
    """A parenthesised import that spans several lines puts one name on each, so a file cannot meet the
    line limit by packing its imports (service.py once did)."""
    folded = []
    for path in our_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.end_lineno and node.end_lineno > node.lineno:
                lines = node.end_lineno - node.lineno - 1  # between the opening and closing lines
                if len(node.names) > max(lines, 1):
                    folded.append(f"{path.relative_to(ROOT)}:{node.lineno} ({len(node.names)} names on {lines} lines)")
    assert folded == []
