"""The import graph matches the architecture documented in docs/design.md.

Every ``import`` in our packages, module level or inside a function, is
read from the source (ast) and checked against the direction table in
docs/design.md ("Import directions"), which this test parses: the document
and the code cannot drift apart. There must be no import cycle between
modules either. A documented exception (a line ``- exception: `a.b` → `pkg```)
must stay function-local; there is none today.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [ROOT, ROOT / "kernels", ROOT / "integrations", ROOT / "benchmarks", ROOT / "training", ROOT / "testkit"]
DESIGN = ROOT / "docs" / "design.md"


def our_packages() -> dict[str, Path]:
    found = {}
    for source_root in SOURCE_ROOTS:
        for init in sorted(source_root.glob("leyline_*/__init__.py")):
            found[init.parent.name] = init.parent
    return found


PACKAGES = our_packages()


def module_name(path: Path, package_dir: Path) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, module: str, is_package: bool) -> list[tuple[str, bool]]:
    """(imported module, imported at module level) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = type_checking_lines(tree)
    top_level = {id(n) for n in tree.body} | {
        id(n) for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try)) for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = module.split(".")
                parent = parent if is_package else parent[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            # "from pkg import sub" may import a submodule: count it when it is one.
            names = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
        found += [(name, id(node) in top_level) for name in names]
    return found


def is_module(name: str) -> bool:
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return False
    path = PACKAGES[top].joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph() -> dict[str, list[tuple[str, bool]]]:
    edges = {}
    for package_dir in PACKAGES.values():
        for path in sorted(package_dir.rglob("*.py")):
            module = module_name(path, package_dir)
            edges[module] = [(name, eager) for name, eager in imports_of(path, module, path.name == "__init__.py")
                             if name.split(".")[0] in PACKAGES]
    return edges


def documented_directions() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """The "Import directions" table of docs/design.md: package -> packages it may import; exceptions."""
    text = DESIGN.read_text()
    section = text.split("## Import directions", 1)[1].split("\n## ", 1)[0]
    allowed: dict[str, set[str]] = {}
    for row in re.findall(r"^\| `(leyline_\w+)` \|([^|]*)\|", section, re.M):
        package, targets = row
        allowed[package] = set(re.findall(r"`(leyline_\w+|\*)`", targets))
    exceptions = set(re.findall(r"^- exception: `([\w.]+)` → `(leyline_\w+)`", section, re.M))
    return allowed, exceptions


def torch_free_exceptions() -> set[tuple[str, str]]:
    """``(package, module)``: the package may import that (torch-free) module and what it imports."""
    section = DESIGN.read_text().split("## Import directions", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- torch-free exception: `(leyline_\w+)` → `([\w.]+)`", section, re.M))


def test_the_design_doc_covers_every_package():
    allowed, _ = documented_directions()
    assert set(PACKAGES) <= set(allowed), f"add {set(PACKAGES) - set(allowed)} to docs/design.md"
    assert {"leyline_sdk", "leyline_runtime", "leyline_kernels", "leyline_langchain"} <= set(PACKAGES)


def test_imports_flow_as_documented():
    allowed, exceptions = documented_directions()
    torch_free = torch_free_exceptions()
    wrong = []
    for module, imports in graph().items():
        source = module.split(".")[0]
        for name, eager in imports:
            target = name.split(".")[0]
            if target == source or "*" in allowed[source] or target in allowed[source]:
                continue
            if (module, target) in exceptions and not eager:
                continue
            if any(p == source and (name == m or name.startswith(m + ".")) for p, m in torch_free):
                continue
            wrong.append(f"{module} -> {name}{'' if eager else ' (in a function)'}")
    assert wrong == []


def test_documented_exceptions_exist_and_stay_lazy():
    _, exceptions = documented_directions()
    edges = graph()
    for module, target in exceptions:
        uses = [eager for name, eager in edges[module] if name.split(".")[0] == target]
        assert uses, f"docs/design.md lists {module} -> {target}, which the code no longer has: drop it"
        assert not any(uses), f"{module} must import {target} inside functions only"


def test_torch_free_exceptions_stay_torch_free():
    """What another package may import of ours under a torch-free exception imports only FastAPI,
    leyline_sdk and itself: no torch, and none of the rest of its package."""
    exceptions = torch_free_exceptions()
    assert exceptions, "docs/design.md lists no torch-free exception: drop this test"
    for _, allowed_module in exceptions:
        code = (f"import sys, {allowed_module}, pkgutil, importlib\n"
                f"for m in pkgutil.walk_packages(getattr({allowed_module}, '__path__', []), '{allowed_module}.'):\n"
                f"    importlib.import_module(m.name)\n"
                f"top = '{allowed_module}'.split('.')[0]\n"
                f"bad = [m for m in sys.modules if m == 'torch' or (m.startswith(top + '.') and m != top\n"
                f"       and not (m == '{allowed_module}' or m.startswith('{allowed_module}.'))\n"
                f"       and m != top + '.extras')]\n"
                f"print(bad); sys.exit(1 if bad else 0)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, SOURCE_ROOTS))})
        assert done.returncode == 0, f"{allowed_module} loads {done.stdout or done.stderr}"


def test_no_import_cycles():
    edges = {m: {name for name, _ in imports if name in PACKAGES or is_module(name)} for m, imports in graph().items()}
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    def parents(m: str) -> set[str]:
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if n in parents(m):
                continue
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["leyline_sdk", "leyline_runtime", "leyline_kernels", "leyline_langchain", "leyline_vllm"])
def test_typed_packages_ship_py_typed(package):
    # the libraries others import; leyline_bench and leyline_training are tools
    assert (PACKAGES[package] / "py.typed").is_file()


LAYERED = ["leyline_runtime", "leyline_vllm", "leyline_bench"]  # packages whose docs/design.md section "Inside <package>" has a part table


def package_layers(package: str) -> dict[str, set[str]]:
    """The "Inside <package>" table of docs/design.md: part -> parts it may import."""
    section = DESIGN.read_text().split(f"## Inside {package}", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for part, targets in re.findall(r"^\| `(\w+)/?` \|[^|]*\|([^|]*)\|", section, re.M):
        layers[part] = set(re.findall(r"`(\w+|\*)`", targets))
    return layers


def package_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.mark.parametrize("package", LAYERED)
def test_the_layer_table_covers_every_part(package):
    parts = {package_part(m) for m in graph() if m.startswith(package + ".")}
    assert parts <= set(package_layers(package)), f"add {parts - set(package_layers(package))} to docs/design.md"


@pytest.mark.parametrize("package", LAYERED)
def test_layers_import_downwards_only(package):
    layers = package_layers(package)
    wrong = []
    for module, imports in graph().items():
        if not module.startswith(package + "."):
            continue
        source = package_part(module)
        for name, _ in imports:
            if not name.startswith(package + ".") or package_part(name) == source:
                continue
            if "*" not in layers[source] and package_part(name) not in layers[source]:
                wrong.append(f"{module} -> {name}")
    assert wrong == []
