"""Real tools over a generated :class:`~.world.World`.

Every tool returns text; a failure returns ``"Error: ..."`` text (never raises),
the way agent frameworks hand tool errors back to the model. All tools are
deterministic functions of ``(world, arguments)`` and never mutate the world.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import operator
from typing import Any

from .world import World, call_function

TOOLS: list[dict] = [
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. (37*12)-5"}},
            "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "search_files",
        "description": "Search all files for lines containing the query (case-insensitive).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "text to look for"}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "path relative to the repository root"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests",
        "description": "Run the unit tests (all, or one test file) and list the failing tests.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "a test file such as tests/test_x.py (optional)"}},
            "required": []}}},
    {"type": "function", "function": {
        "name": "kv_get",
        "description": "Look up the value stored under a key in the key-value store.",
        "parameters": {"type": "object", "properties": {
            "key": {"type": "string", "description": "the key"}},
            "required": ["key"]}}},
]

# The two tools of ``examples/langgraph_agent.py`` exactly as LangChain sends them
# (``convert_to_openai_tool`` of its ``@tool`` functions): the "order" tasks offer these,
# so that example's requests are in the training distribution (names and values are not).
ORDER_TOOLS: list[dict] = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
        "parameters": {"properties": {"expression": {"type": "string"}}, "required": ["expression"],
                       "type": "object"}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the working directory.",
        "parameters": {"properties": {"path": {"type": "string"}}, "required": ["path"], "type": "object"}}},
]

TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
_SPECS = {t["function"]["name"]: t["function"] for t in TOOLS}

MAX_SEARCH_RESULTS = 20


# --------------------------------------------------------------------------- calculator

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}
_OP_TEXT = {ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>",
            ast.MatMult: "@"}
_LIMIT = 10 ** 18


class CalcError(Exception):
    pass


def format_number(value: float) -> str:
    """How the calculator prints results: integers plainly, floats to 6 decimals, trimmed."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < _LIMIT:
            return str(int(value))
        text = f"{value:.6f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    return str(value)


def _eval(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op not in _BIN:
            sym = _OP_TEXT.get(op, op.__name__)
            hint = " (use ** for powers)" if op is ast.BitXor else ""
            raise CalcError(f"unsupported operator '{sym}'{hint}")
        left, right = _eval(node.left), _eval(node.right)
        if op is ast.Pow and (abs(right) > 64 or abs(left) > 10 ** 6):
            raise CalcError("OverflowError: power too large")
        try:
            result = _BIN[op](left, right)
        except ZeroDivisionError:
            raise CalcError("ZeroDivisionError: division by zero") from None
        if isinstance(result, complex):
            raise CalcError("ValueError: complex result")
        if abs(result) > _LIMIT:
            raise CalcError("OverflowError: result too large")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id not in _FUNCS:
            raise CalcError(f"NameError: name '{node.func.id}' is not defined")
        args = [_eval(a) for a in node.args]
        try:
            return _FUNCS[node.func.id](*args)
        except (TypeError, ValueError) as exc:
            raise CalcError(f"{type(exc).__name__}: {exc}") from None
    if isinstance(node, ast.Name):
        raise CalcError(f"NameError: name '{node.id}' is not defined")
    raise CalcError(f"unsupported expression: {type(node).__name__}")


def calculator(expression: str) -> str:
    if not expression.strip():
        return "Error: SyntaxError: empty expression"
    if len(expression) > 500:
        return "Error: ValueError: expression too long"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        return f"Error: SyntaxError: {exc.msg}"
    try:
        return format_number(_eval(tree))
    except CalcError as exc:
        return f"Error: {exc}"


# --------------------------------------------------------------------------- files


def search_files(world: World, query: str) -> str:
    if not query.strip():
        return "Error: ValueError: query must not be empty"
    q = query.lower()
    hits = []
    for path, text in world.files.items():
        for i, line in enumerate(text.splitlines(), 1):
            if q in line.lower():
                hits.append(f"{path}:{i}: {line.strip()}")
    if not hits:
        return f"No matches for '{query}'."
    out = hits[:MAX_SEARCH_RESULTS]
    if len(hits) > MAX_SEARCH_RESULTS:
        out.append(f"... {len(hits) - MAX_SEARCH_RESULTS} more matches")
    return "\n".join(out)


def _suggest(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def read_file(world: World, path: str) -> str:
    norm = path.strip()
    norm = norm.removeprefix("./")
    if norm in world.files:
        return world.files[norm]
    prefix = norm.rstrip("/") + "/"
    inside = [p for p in world.files if p.startswith(prefix)]
    if inside:
        return f"Error: IsADirectoryError: '{path}' is a directory. Files: " + ", ".join(inside[:10])
    return f"Error: FileNotFoundError: '{path}' not found.{_suggest(norm, list(world.files))}"


# --------------------------------------------------------------------------- tests


def execute_test_file(world: World, test_path: str) -> list[tuple[str, bool, str]]:
    """Execute one test file's tests for real: ``(test name, passed, reason)``."""
    mod = next(m for m in world.modules.values() if m.test_path == test_path)
    by_name = {fn.name: fn for fn in mod.functions}
    source = world.files[test_path]
    tree = ast.parse(source)
    results = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        stmt = node.body[0]
        assert isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)
        call, expected_node = stmt.test.left, stmt.test.comparators[0]
        fn = by_name[call.func.id]
        args = tuple(ast.literal_eval(a) for a in call.args)
        expected = ast.literal_eval(expected_node)
        try:
            got = call_function(fn, args)
        except Exception as exc:  # noqa: BLE001 -- the generated code's failure is the test's result
            results.append((node.name, False, f"{type(exc).__name__}: {exc}"))
            continue
        if got == expected:
            results.append((node.name, True, ""))
        else:
            results.append((node.name, False,
                            f"AssertionError: assert {fn.name}({args[0]}, {args[1]}) == {expected} (got {got})"))
    return results


def run_tests(world: World, path: str | None = None) -> str:
    test_paths = sorted(m.test_path for m in world.modules.values())
    if path is None or not path.strip() or path.strip() in ("tests", "tests/", "."):
        selected = test_paths
    else:
        norm = path.strip()
        norm = norm.removeprefix("./")
        by_module = {m.path: m.test_path for m in world.modules.values()}
        if norm in test_paths:
            selected = [norm]
        elif norm in by_module:
            selected = [by_module[norm]]
        else:
            return f"Error: no tests found at '{path}'. Test files: " + ", ".join(test_paths)
    lines, failures = [], []
    n_pass = 0
    for tp in selected:
        for name, ok, reason in execute_test_file(world, tp):
            lines.append(f"{tp}::{name} {'PASSED' if ok else 'FAILED'}")
            if ok:
                n_pass += 1
            else:
                failures.append(f"FAILED {tp}::{name} - {reason}")
    out = [f"collected {len(lines)} items", ""] + lines
    if failures:
        out += [""] + failures
    summary = f"{len(failures)} failed, {n_pass} passed" if failures else f"{n_pass} passed"
    out.append(f"==== {summary} ====")
    return "\n".join(out)


# --------------------------------------------------------------------------- kv


def kv_get(world: World, key: str) -> str:
    if key in world.kv:
        return world.kv[key]
    return f"Error: KeyError: '{key}' not found.{_suggest(key, list(world.kv))}"


# --------------------------------------------------------------------------- dispatch


def validate_call(name: str, arguments: Any, tools: list[dict] | None = None) -> str | None:
    """``None`` when the call names a real tool with valid arguments, else the reason."""
    specs = _SPECS if tools is None else {t.get("function", t)["name"]: t.get("function", t) for t in tools}
    if name not in specs:
        return f"unknown tool '{name}'. Available tools: {', '.join(specs)}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"arguments are not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    params = specs[name].get("parameters", {})
    props = params.get("properties", {})
    for req in params.get("required", []):
        if req not in arguments:
            return f"{name}() missing required argument '{req}'"
    for key, value in arguments.items():
        if key not in props:
            return f"{name}() got an unexpected argument '{key}'"
        kind = props[key].get("type")
        if kind == "string" and not isinstance(value, str):
            return f"{name}() argument '{key}' must be a string"
        if kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{name}() argument '{key}' must be an integer"
    return None


def execute(world: World, name: str, arguments: dict | str) -> str:
    # A "custom_tool" task's world holds the caller's own tools (.custom_tools): those are what it offers.
    offered = [t.spec for t in world.custom_tools.values()] or None
    problem = validate_call(name, arguments, offered)
    if problem is not None:
        kind = "ValueError" if "JSON" in problem or "object" in problem else "TypeError"
        if problem.startswith("unknown tool"):
            return f"Error: {problem}"
        return f"Error: {kind}: {problem}"
    if isinstance(arguments, str):
        arguments = json.loads(arguments or "{}")
    if name in world.custom_tools:
        return world.custom_tools[name].run(arguments)
    if name == "calculator":
        return calculator(arguments["expression"])
    if name == "search_files":
        return search_files(world, arguments["query"])
    if name == "read_file":
        return read_file(world, arguments["path"])
    if name == "run_tests":
        return run_tests(world, arguments.get("path"))
    if name == "kv_get":
        return kv_get(world, arguments["key"])
    raise AssertionError(name)  # validate_call covers every name
