"""Task kinds answered with one tool's help: a calculation, a key's value, a test file's failures, a
service's attribute, a constant in the code (and the variants that must report an error or a miss).
"""

from __future__ import annotations

import random
import re

from . import names as N
from .task_play import Play, Spec, say
from .tools import calculator, execute, execute_test_file
from .world import World


_WORD_OPS = {"+": "plus", "-": "minus", "*": "times"}


def _random_expression(rng: random.Random) -> str:
    a, b, c, d = (rng.randint(2, 99) for _ in range(4))
    big = rng.randint(100, 999)
    forms = [
        f"({a}*{b})-{c}", f"{a} + {b} * {c}", f"({a} + {b}) / {c}", f"{a}**2 - {b}", f"{big} % {a} + {c}",
        f"({a} - {b}) * ({c} + {d})", f"{big} // {a}", f"{a} * {b} * {c}", f"{big} - {a} * {b}",
        f"({big} + {a}) / ({b} - {c})" if b != c else f"{big} / {a}", f"{a}.5 * {b}", f"{big} * {a} + {b} * {c}",
        f"({a} + {b} + {c}) / 3", f"{big}*{a}", f"{a}*({b}+{c})-{d}",
    ]
    return rng.choice(forms)


def _break_expression(rng: random.Random, expr: str) -> str:
    options = []
    if ")" in expr:
        i = expr.rindex(")")
        options.append(expr[:i] + expr[i + 1:])  # '(' was never closed
    if "*" in expr and "**" not in expr:
        options.append(expr.replace("*", " x ", 1))
    if "**" in expr:
        options.append(expr.replace("**", "^", 1))
    options.append(expr + " +")
    options.append(expr.replace(" ", "", 1) + ")")
    for cand in rng.sample(options, len(options)):
        if calculator(cand).startswith("Error"):
            return cand
    return expr + " *"


def _kind_calc(rng: random.Random, world: World, split: str) -> Spec | None:
    expr = _random_expression(rng)
    result = calculator(expr)
    if result.startswith("Error"):
        return None
    worded = rng.random() < 0.1
    if worded:
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99)
        o1, o2 = rng.choice("+-*"), rng.choice("+-*")
        expr = f"{a} {o1} {b} {o2} {c}"
        result = calculator(expr)
        shown = f"{a} {_WORD_OPS[o1]} {b} {_WORD_OPS[o2]} {c}"
    else:
        shown = expr
    user = rng.choice(["What is {e}?", "Compute {e}.", "Calculate {e} for me.", "Please evaluate {e}.",
                       "I need the value of {e}.", "what's {e}"]).format(e=shown)
    broken = rng.random() < 0.25
    bad = _break_expression(rng, expr) if broken else None

    def solve(p: Play) -> None:
        pre = ["I'll use the calculator.", "Let me compute that.", "Computing with the calculator."]
        if worded:
            pre = [f"In symbols that is {expr}.", "I'll turn the words into an expression and compute it."]
        if bad is not None:
            out = p.one(say(p.rng, pre), "calculator", {"expression": bad})
            fix = [f"The calculator reported an error ({out[7:].split(':')[0]}). I'll fix the expression.",
                   "That expression was malformed. Retrying with a corrected one.",
                   "Syntax problem; correcting the expression."]
            if "^" in bad:
                fix = ["The calculator does not accept ^ for powers; using ** instead."]
            p.one(p.rng.choice(fix), "calculator", {"expression": expr})
        else:
            p.one(say(p.rng, pre), "calculator", {"expression": expr})
        p.answer(p.rng.choice([f"{shown} = {result}.", f"The result is {result}.", f"The answer is {result}.",
                               f"{result}", f"It comes to {result}."]))

    return user, result, [(result,)], [], solve


def _kind_div_zero(rng: random.Random, world: World, split: str) -> Spec | None:
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    expr = rng.choice([f"{a} / ({b} - {b})", f"{a} // ({b} - {b})", f"{a} % 0", f"({a} + {b}) / 0"])
    user = rng.choice(["What is {e}?", "Compute {e}.", "Evaluate {e}."]).format(e=expr)

    def solve(p: Play) -> None:
        p.one(say(p.rng, ["Let me compute that."]), "calculator", {"expression": expr})
        p.answer(p.rng.choice(["The expression divides by zero, so it has no value (ZeroDivisionError).",
                               "It is undefined: the calculator reports a division by zero."]))

    return user, "undefined: division by zero", [("zero", "ZeroDivisionError")], [], solve


def typo_key(rng: random.Random, key: str, keys: list[str]) -> str | None:
    cands = []
    if "." in key:
        cands.append(key.replace(".", "_", 1))
    if "_" in key:
        cands.append(key.replace("_", ".", 1))
        cands.append(key.replace("_", "", 1))
    i = rng.randrange(1, len(key) - 1)
    cands.append(key[:i] + key[i + 1:])
    cands.append(key[:i] + key[i + 1] + key[i] + key[i + 2:] if i + 2 <= len(key) else key + "s")
    cands.append(key + "s")
    rng.shuffle(cands)
    for c in cands:
        if c != key and c not in keys:
            return c
    return None


def _kind_kv(rng: random.Random, world: World, split: str) -> Spec | None:
    keys = list(world.kv)
    key = rng.choice(keys)
    value = world.kv[key]
    user = rng.choice(["What is the value of key {k}?", "Look up {k} in the key-value store.",
                       "What is {k} set to?", "Get me the value stored under `{k}`.",
                       "Tell me the value of {k}.", "kv lookup: {k}"]).format(k=key)
    typo = typo_key(rng, key, keys) if rng.random() < 0.3 else None

    def solve(p: Play) -> None:
        pre = ["Looking up the key.", "Let me check the key-value store.", f"Fetching {key}."]
        if typo is not None:
            out = p.one(say(p.rng, pre), "kv_get", {"key": typo})
            m = re.search(r"Did you mean '([^']+)'", out)
            if m and m.group(1) == key:
                fix = [f"That key does not exist; the error suggests '{key}'.", f"Wrong key. Retrying with {key}."]
            else:
                fix = [f"That key does not exist. The task asks for {key}, so I'll use that exact key."]
            p.one(p.rng.choice(fix), "kv_get", {"key": key})
        else:
            p.one(say(p.rng, pre), "kv_get", {"key": key})
        p.answer(p.rng.choice([f"The value of {key} is {value}.", f"{key} = {value}",
                               f"It is set to {value}.", f"{key} is {value}."]))

    return user, value, [(value,)], [], solve


def _kind_kv_missing(rng: random.Random, world: World, split: str) -> Spec | None:
    key = f"{rng.choice(N.nouns(split))}.{rng.choice(N.ATTRS)}"
    if key in world.kv or "Did you mean" in execute(world, "kv_get", {"key": key}):
        return None
    user = rng.choice(["What is the value of key {k}?", "Look up {k} in the key-value store."]).format(k=key)

    def solve(p: Play) -> None:
        p.one(say(p.rng, ["Looking up the key."]), "kv_get", {"key": key})
        p.answer(p.rng.choice([f"The key {key} does not exist in the store (KeyError, no close match).",
                               f"There is no key {key}: the store reports it as not found."]))

    return user, "not found", [("not found", "does not exist", "no key")], [], solve


def _failing(world: World, test_path: str) -> tuple[list[tuple[str, str]], list[str]]:
    fails, passes = [], []
    for name, ok, reason in execute_test_file(world, test_path):
        (passes.append(name) if ok else fails.append((name, reason)))
    return fails, passes


def _kind_tests(rng: random.Random, world: World, split: str) -> Spec | None:
    mod = rng.choice(list(world.modules.values()))
    fails, passes = _failing(world, mod.test_path)
    ref = mod.name if rng.random() < 0.7 else mod.path
    user = rng.choice(["Which tests fail in module {m}?", "Run the tests for {m} and tell me which ones fail.",
                       "Are there failing tests in {m}?", "Which of the {m} tests are broken?"]).format(m=ref)
    wrong = rng.random() < 0.25
    names = ", ".join(n for n, _ in fails)
    if fails:
        answer = rng.choice([f"{len(fails)} of {len(fails) + len(passes)} tests fail in {mod.name}: {names}.",
                             f"The failing tests are {names}.", f"Failing: {names}."])
        required = [(n,) for n, _ in fails]
    else:
        answer = rng.choice([f"All {len(passes)} tests in {mod.name} pass.",
                             f"No test fails: all {len(passes)} tests pass."])
        required = [("pass",)]

    def solve(p: Play) -> None:
        pre = ["Running the tests.", f"Let me run {mod.test_path}.", "I'll run the module's tests."]
        if wrong:
            bad = p.rng.choice([f"tests/{mod.name}.py", f"test_{mod.name}.py", f"tests/test_{mod.name}"])
            p.one(say(p.rng, pre), "run_tests", {"path": bad})
            p.one(p.rng.choice([f"No tests there; the test file is {mod.test_path}.",
                                "Wrong path. Using the test file from the list."]),
                  "run_tests", {"path": mod.test_path})
        else:
            p.one(say(p.rng, pre), "run_tests", {"path": mod.test_path})
        p.answer(answer)

    return user, names or "all pass", required, passes, solve


def _kind_tests_all(rng: random.Random, world: World, split: str) -> Spec | None:
    fails, passes = [], []
    for mod in world.modules.values():
        f, ps = _failing(world, mod.test_path)
        fails += f
        passes += ps
    if len(fails) > 8:
        return None
    user = rng.choice(["Which tests are failing?", "Run the whole test suite and list the failures.",
                       "Is the test suite green? If not, which tests fail?"])
    names = ", ".join(n for n, _ in fails)

    def solve(p: Play) -> None:
        p.one(say(p.rng, ["Running the whole suite.", "Let me run all the tests."]), "run_tests", {})
        if fails:
            p.answer(p.rng.choice([f"{len(fails)} tests fail: {names}.", f"The failing tests are {names}."]))
        else:
            p.answer(f"The suite is green: all {len(passes)} tests pass.")

    required = [(n,) for n, _ in fails] if fails else [("pass", "green")]
    return user, names or "all pass", required, passes, solve


def _kind_tests_reason(rng: random.Random, world: World, split: str) -> Spec | None:
    mods = list(world.modules.values())
    rng.shuffle(mods)
    for mod in mods:
        fails, _ = _failing(world, mod.test_path)
        if fails:
            break
    else:
        return None
    test, reason = rng.choice(fails)
    user = rng.choice(["Why does {t} fail?", "What is the failure reason of {t}?",
                       "{t} is red. What does the test runner say?"]).format(t=test)
    m = re.search(r"== (-?\d+) \(got (-?\d+)\)", reason)
    required = [(m.group(1),), (m.group(2),)] if m else [(reason.split(":")[0],)]

    def solve(p: Play) -> None:
        if p.rng.random() < 0.5:
            p.one(say(p.rng, ["Let me find the test first."]), "search_files", {"query": test})
            p.one(p.rng.choice([f"It lives in {mod.test_path}. Running it.", f"Running {mod.test_path}."]),
                  "run_tests", {"path": mod.test_path})
        else:
            p.one(say(p.rng, ["Running its test file.", f"Running {mod.test_path}."]),
                  "run_tests", {"path": mod.test_path})
        if m:
            p.answer(p.rng.choice([f"{test} fails with: {reason}",
                                   f"It expects {m.group(1)} but the function returned {m.group(2)} ({reason})."]))
        else:
            p.answer(f"{test} fails with an exception: {reason}")

    return user, reason, required, [], solve


_ATTR_WORDS = {"port": "port", "timeout_ms": "timeout (timeout_ms)", "replicas": "number of replicas",
               "region": "region"}


def _find_service(p: Play, svc, failure: bool) -> None:
    """Search for the service's config (maybe after a failed guess), then read it."""
    rng = p.rng
    noun = svc.name.split("-")[0]
    if failure and rng.random() < 0.5:
        guess = rng.choice([f"services/{svc.name}/config.yaml", f"config/{svc.name}.yaml",
                            f"{svc.name}.yaml", f"deploy/{svc.name}.yaml"])
        if guess != svc.path:
            out = p.one(say(rng, [f"I'll try the usual config path for {svc.name}."], 0.2),
                        "read_file", {"path": guess})
            m = re.search(r"Did you mean '([^']+)'", out)
            if m and m.group(1) == svc.path:
                p.one(f"Not found; the error suggests {svc.path}.", "read_file", {"path": svc.path})
                return
            p.one(rng.choice(["That file does not exist. Searching instead.", "Wrong guess; let me search."]),
                  "search_files", {"query": f"service: {svc.name}"})
            p.one(say(rng, [f"It is defined in {svc.path}."], 0.3), "read_file", {"path": svc.path})
            return
    if failure:
        p.one(say(rng, ["Searching for it."]), "search_files", {"query": f"{svc.name} service"})
        p.one(rng.choice(["No matches. Trying just the name.", "Too specific; searching for the name only."]),
              "search_files", {"query": svc.name})
    else:
        query = rng.choice([svc.name, f"service: {svc.name}", svc.name, noun])
        p.one(say(rng, [f"Let me find where {svc.name} is defined.", "Searching the repository."]),
              "search_files", {"query": query})
    p.one(say(rng, [f"{svc.path} defines it. Reading it.", f"The definition is in {svc.path}."], 0.3),
          "read_file", {"path": svc.path})


def _kind_service_attr(rng: random.Random, world: World, split: str) -> Spec | None:
    svc = rng.choice(list(world.services.values()))
    attr = rng.choice(["port", "port", "port", "timeout_ms", "replicas", "region"])
    value = str(getattr(svc, attr))
    if attr == "port" and rng.random() < 0.6:
        user = rng.choice(["Find the file that defines {s} and tell me its port.",
                           "Which config file defines the {s} service, and what port does it use?",
                           "Where is {s} configured? I need the file and its port."]).format(s=svc.name)
        required = [(svc.path,), (value,)]
        answer = [f"{svc.name} is defined in {svc.path}; its port is {value}.",
                  f"File: {svc.path}. Port: {value}.", f"{svc.path} defines {svc.name}, which listens on port {value}."]
    else:
        word = _ATTR_WORDS[attr]
        user = rng.choice(["What is the {w} of {s}?", "Which {w} does the {s} service use?",
                           "Tell me the {w} configured for {s}."]).format(w=word, s=svc.name)
        required = [(value,)]
        answer = [f"The {word} of {svc.name} is {value}.", f"{svc.name} uses {attr} {value} (from {svc.path}).",
                  f"{attr}: {value}"]
    failure = rng.random() < 0.25

    def solve(p: Play) -> None:
        _find_service(p, svc, failure)
        p.answer(p.rng.choice(answer))

    return user, value, required, [], solve


def _kind_constant(rng: random.Random, world: World, split: str) -> Spec | None:
    mod = rng.choice(list(world.modules.values()))
    const, value = rng.choice(list(mod.constants.items()))
    by_path = rng.random() < 0.6
    ref = mod.path if by_path else f"the {mod.name} module"
    user = rng.choice(["What is {c} set to in {r}?", "What value does {c} have in {r}?",
                       "Read {r} and tell me {c}."]).format(c=const, r=ref)

    def solve(p: Play) -> None:
        if by_path:
            p.one(say(p.rng, [f"Reading {mod.path}."]), "read_file", {"path": mod.path})
        else:
            if p.rng.random() < 0.4:
                guess = f"src/{mod.name}.py"
                p.one(say(p.rng, ["Let me open the module."]), "read_file", {"path": guess})
                p.one("Not there. Searching for the module file.", "search_files", {"query": f"{const} ="})
            else:
                p.one(say(p.rng, ["Searching for the constant."]), "search_files", {"query": const})
            p.one(say(p.rng, [f"The module is {mod.path}."], 0.3), "read_file", {"path": mod.path})
        p.answer(p.rng.choice([f"{const} is {value} in {mod.path}.", f"{const} = {value}",
                               f"It is set to {value}."]))

    return user, str(value), [(str(value),)], [], solve
