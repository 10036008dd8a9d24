"""Only the runtime reaches into a runtime: the rest of the repository goes through its public API.

The block manager is the one owner of KV blocks only if nothing outside ``leyline_runtime``
takes, trims or gives back blocks, writes the session map or drives a session's block table
itself. Benches and tests read and try what they need through ``Runtime``'s methods and
``leyline_runtime.inspection.Inspector``. This test reads every module outside the runtime
package (ast) and fails on a reach into a runtime:

* a ``_``-prefixed attribute of a runtime (``rt._get``, ``runtime._sessions``,
  ``self.runtime._lock``);
* its block manager or pool (``rt.blocks``, ``runtime.pool``, ``rt.engine.blocks``), used
  in any way: a pool handed to a helper is a reach too.

What counts as a runtime: a name or attribute called ``runtime`` or ``rt`` (``_runtime``,
``..._runtime`` and ``..._rt`` too), a name bound to a ``Runtime(...)`` call, and a
parameter annotated ``Runtime``. A class's own ``self._x`` or an unrelated ``self.pool`` is
not a runtime. ``tests/runtime`` is the runtime's own white-box suite and is not scanned.

Inside the package, ``leyline_runtime/inspection.py`` (what benches and tests read and try beyond
the REST surface) is scanned too, more strictly: it is built on the runtime's public primitives, so
it uses no private of any other object or module (``rt._lock``, ``pool._free``, an imported
``_clip``) and never a runtime's block manager; reading the pool's rows is its business.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["benchmarks", "training", "testkit", "integrations", "tests", "examples"]
WHITE_BOX = [ROOT / "tests" / "runtime"]  # the runtime's own unit tests
INSPECTOR = ROOT / "leyline_runtime" / "inspection.py"
RUNTIME_NAMES = {"runtime", "rt", "_runtime", "_rt"}
OWNED_STATE = {"blocks", "pool"}  # the block manager and the pool: the runtime's alone


def _named_like_a_runtime(name: str) -> bool:
    return name in RUNTIME_NAMES or name.endswith(("_runtime", "_rt"))


def _runtime_bindings(tree: ast.AST) -> set[str]:
    """Names bound to ``Runtime(...)`` or annotated ``Runtime`` anywhere in the module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _calls_runtime(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.arg, ast.AnnAssign)) and _is_runtime_annotation(node.annotation):
            target = node if isinstance(node, ast.arg) else node.target
            names.add(target.arg if isinstance(target, ast.arg) else getattr(target, "id", ""))
    return names - {""}


def _calls_runtime(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "Runtime") or (
        isinstance(func, ast.Attribute) and func.attr == "Runtime")


def _is_runtime_annotation(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).strip("'\"")
    return text.split(".")[-1].split(" ")[0] == "Runtime"


def _is_runtime(node: ast.expr, bound: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return _named_like_a_runtime(node.id) or node.id in bound
    return isinstance(node, ast.Attribute) and _named_like_a_runtime(node.attr)


def reaches(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every reach into a runtime in ``source``."""
    tree = ast.parse(source)
    bound = _runtime_bindings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "engine":  # rt.engine.blocks: the same owner
            owner = owner.value if node.attr in OWNED_STATE else None
        if owner is None or not _is_runtime(owner, bound):
            continue
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if private or node.attr in OWNED_STATE:
            found.append((node.lineno, ast.unparse(node)))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def inspector_reaches(source: str) -> list[tuple[int, str]]:
    """(line, expression) of everything in ``source`` the inspector may not use: a private of
    anything but itself (an attribute, or a name imported) and a runtime's block manager."""
    found = {(line, expr) for line, expr in reaches(source) if not expr.endswith(".pool")}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.add((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            found |= {(node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)}
    return sorted(found)


def scanned_modules() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")
                  if not any(p.is_relative_to(w) for w in WHITE_BOX) and ".venv" not in p.parts)


def test_nothing_outside_the_runtime_reaches_into_one():
    found = [f"{path.relative_to(ROOT)}:{line}: {expr}" for path in scanned_modules()
             for line, expr in sorted(reaches(path.read_text()))]
    assert found == [], "use Runtime's methods or leyline_runtime.inspection.Inspector:\n" + "\n".join(found)


def test_the_inspector_uses_only_the_runtime_public_primitives():
    found = [f"leyline_runtime/inspection.py:{line}: {expr}" for line, expr in inspector_reaches(INSPECTOR.read_text())]
    assert found == [], "build it on Runtime's public primitives (hold, room, prefill_messages...):\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "class Inspector:\n    def f(self):\n        with self.runtime._lock:\n            pass",
    "def f(rt, s):\n    rt._grow(s, 4)",
    "def f(pool):\n    return pool._free",
    "from leyline_runtime.model.batch import BatchLayout, _clip",
    "class Inspector:\n    def f(self):\n        return self.runtime.blocks.take(2)",
    "def f(rt):\n    rt.engine.blocks.release([1])",
])
def test_the_inspector_scan_catches_a_private(source):
    assert inspector_reaches(source), source


@pytest.mark.parametrize("source", [
    "class Inspector:\n    def f(self):\n        return self._after_header() + self.runtime.pool.rows",
    "def f(rt):\n    with rt.hold('s') as s, rt.room.scratch_table(4) as t:\n        return s.table.rows(0, 4), t",
])
def test_the_inspector_scan_leaves_public_primitives_alone(source):
    assert inspector_reaches(source) == [], source


def test_the_scan_covers_benches_and_tests():
    scanned = {p.relative_to(ROOT).parts[:2] for p in scanned_modules()}
    assert ("benchmarks", "leyline_bench") in scanned and ("tests", "bench") in scanned
    assert ("tests", "runtime") not in scanned


@pytest.mark.parametrize("source", [
    "def f(rt):\n    return rt._get('t', 's')",
    "def f(runtime):\n    runtime._sessions[('t', 's')] = 1",
    "class A:\n    def f(self):\n        with self.runtime._lock:\n            pass",
    "def f(rt, s):\n    rt.blocks.trim(s.table, 3)",
    "def f(runtime):\n    return runtime.pool.rows",
    "def f(runtime):\n    shuffle(runtime.pool)",
    "def f(rt, t):\n    rt.engine.blocks.reserve(t, 4)",
    "small = Runtime(config)\nsmall._grow(s, 4)",
    "def f(r: Runtime):\n    return r._sessions",
    "def f(r: 'Runtime'):\n    return r.blocks",
    "def f(app):\n    return app.state.runtime._evicted",
])
def test_the_scan_catches_a_reach(source):
    assert reaches(source), source


@pytest.mark.parametrize("source", [
    "class A:\n    def f(self):\n        return self._x + self.pool.num_free",
    "def f(pool):\n    return pool._free",
    "def f(rt):\n    return rt.get_session('s', 't').counters, rt.engine.device, rt.config.block_size",
    "def f(runtime):\n    return runtime.__class__, runtime.tokenizer.role_ids",
    "def f(rt, monkeypatch):\n    monkeypatch.setattr(rt.engine, 'decode', None)",
    "def f(engine):\n    return engine.blocks",
])
def test_the_scan_leaves_other_objects_alone(source):
    assert reaches(source) == [], source
