"""Synthetic agent transcripts with checkable answers.

``make_transcript(seed, split)`` builds a world, a task and a worked solution:
system prompt (with the tool list from :func:`render_tools`), the user task,
assistant tool calls in the chat template's format, the tools' real outputs
(:func:`.tools.execute`) and a final answer that copies values from them.
Solutions include what agents really do and what Leyline edits: failed calls
with error outputs followed by a corrected retry, long file reads and test
logs, 1-4 tool rounds (a few more with retries), parallel calls.

Everything is a pure function of ``(seed, split)``. The train and test splits
use disjoint seed namespaces *and* disjoint entity-name pools (:mod:`.names`);
the train-side "wide" and "english" splits name their entities with made-up words and
with real words from a 2,997-word list. "custom_tool" tasks (:mod:`.custom_tools`, opt-in)
offer the caller's own tools instead of the repository's.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from leyline_sdk.protocol import FunctionCall, Message, ToolCall

from leyline_runtime.chat_template import render_tools
from leyline_sdk.tools_prompt import tools_message
from . import names as N
from .custom_tools import make_custom_tool_task
from .tools import ORDER_TOOLS, TOOLS, calculator, execute, execute_test_file
from .world import World, make_world

SPLITS = ("train", "test", "wide", "english")  # "wide"/"english": train-side, unmemorisable names (.names)

SYSTEM_PROMPT = (
    "You are a careful agent working in a software repository. Use the tools to look things up, "
    "check every tool result, retry with a corrected call when a tool returns an error, and finish "
    "with a short answer that quotes the exact values you found."
)


def system_message(tools: list[dict] | None = None) -> Message:
    return Message(role="system", content=SYSTEM_PROMPT + "\n\n" + render_tools(tools or TOOLS))


def api_head(tools: list[dict], prompt: str) -> list[Message]:
    """How the runtime's chat routes and LangChain adapter start a prompt: the tools message
    (``leyline_sdk.tools_prompt.tools_message``), then the caller's own system prompt."""
    head = tools_message(tools)
    assert head is not None
    return [head.model_copy(update={"id": None}), Message(role="system", content=prompt)]


# Opt-in mixture knobs (``train``/``evaluate`` --order-share / --api-share). At 0 every transcript is
# what it was before they existed, so the shipped model's recipe and numbers still reproduce.
RECIPE_ORDER_SHARE = 0.12  # of the transcripts: "order" tasks (the LangGraph example's kind of task)
RECIPE_API_SHARE = 0.3  # of the others: starting the way API requests do (see :func:`api_head`)


def _needle(s: str) -> re.Pattern:
    left = r"(?<![A-Za-z0-9_.\-])" if re.match(r"-?\d", s) else r"(?<![A-Za-z0-9_])"
    right = r"(?![A-Za-z0-9_])(?!\.\d)"
    return re.compile(left + re.escape(s) + right)


@dataclass(frozen=True)
class TaskMix:
    """Which tasks :func:`make_transcript` draws when no kind is named (each share a probability)."""
    order_share: float = 0.0  # "order" tasks: the LangGraph example's kind (RECIPE_ORDER_SHARE)
    api_share: float = 0.0  # of the repository-tool tasks: the API prompt layout (RECIPE_API_SHARE)
    custom_tool_share: float = 0.0  # tasks offering the caller's own never-seen tools (.custom_tools)


@dataclass
class Task:
    task_id: str
    split: str
    kind: str
    messages: list[Message]  # system + user: what the agent starts from
    tools: list[dict]
    world: World
    expected: str  # canonical answer text
    required: list[tuple[str, ...]] = field(default_factory=list)  # each: any of these must appear
    forbidden: list[str] = field(default_factory=list)

    def check(self, answer_text: str) -> bool:
        text = answer_text or ""
        for alternatives in self.required:
            if not any(_needle(a).search(text) for a in alternatives):
                return False
        return not any(_needle(f).search(text) for f in self.forbidden)


@dataclass
class Transcript:
    tasks: list[Task]  # the first task, then follow-ups asked later in the same conversation
    messages: list[Message]  # the whole conversation, final answers included

    @property
    def task(self) -> Task:
        return self.tasks[0]

    @property
    def tool_rounds(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant" and m.tool_calls)


class _Play:
    """Plays a solution: appends assistant calls with the tools' real outputs."""

    def __init__(self, world: World, rng: random.Random, messages: list[Message]):
        self.world, self.rng, self.messages = world, rng, messages
        self.n_calls = 0
        self.named = rng.random() < 0.85  # most frameworks send the tool name with the result

    def call(self, text: str, *calls: tuple[str, dict]) -> list[str]:
        tool_calls = []
        for name, args in calls:
            tool_calls.append(ToolCall(id=f"call_{self.n_calls}",
                                       function=FunctionCall(name=name, arguments=json.dumps(args))))
            self.n_calls += 1
        self.messages.append(Message(role="assistant", content=text, tool_calls=tool_calls))
        outs = []
        for tc, (name, args) in zip(tool_calls, calls):
            out = execute(self.world, name, args)
            self.messages.append(Message(role="tool", content=out, tool_call_id=tc.id,
                                         name=name if self.named else None))
            outs.append(out)
        return outs

    def one(self, text: str, name: str, args: dict) -> str:
        return self.call(text, (name, args))[0]

    def answer(self, text: str) -> None:
        self.messages.append(Message(role="assistant", content=text))


def _say(rng: random.Random, options: list[str], p_empty: float = 0.4) -> str:
    return "" if rng.random() < p_empty else rng.choice(options)


# --------------------------------------------------------------------------- task kinds
# Each returns (user text, expected, required, forbidden, solve) or None when the world
# cannot host that kind (the caller then picks another).

Spec = tuple[str, str, list[tuple[str, ...]], list[str], Callable[[_Play], None]]

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

    def solve(p: _Play) -> None:
        pre = ["I'll use the calculator.", "Let me compute that.", "Computing with the calculator."]
        if worded:
            pre = [f"In symbols that is {expr}.", "I'll turn the words into an expression and compute it."]
        if bad is not None:
            out = p.one(_say(p.rng, pre), "calculator", {"expression": bad})
            fix = [f"The calculator reported an error ({out[7:].split(':')[0]}). I'll fix the expression.",
                   "That expression was malformed. Retrying with a corrected one.",
                   "Syntax problem; correcting the expression."]
            if "^" in bad:
                fix = ["The calculator does not accept ^ for powers; using ** instead."]
            p.one(p.rng.choice(fix), "calculator", {"expression": expr})
        else:
            p.one(_say(p.rng, pre), "calculator", {"expression": expr})
        p.answer(p.rng.choice([f"{shown} = {result}.", f"The result is {result}.", f"The answer is {result}.",
                               f"{result}", f"It comes to {result}."]))

    return user, result, [(result,)], [], solve


def _kind_div_zero(rng: random.Random, world: World, split: str) -> Spec | None:
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    expr = rng.choice([f"{a} / ({b} - {b})", f"{a} // ({b} - {b})", f"{a} % 0", f"({a} + {b}) / 0"])
    user = rng.choice(["What is {e}?", "Compute {e}.", "Evaluate {e}."]).format(e=expr)

    def solve(p: _Play) -> None:
        p.one(_say(p.rng, ["Let me compute that."]), "calculator", {"expression": expr})
        p.answer(p.rng.choice(["The expression divides by zero, so it has no value (ZeroDivisionError).",
                               "It is undefined: the calculator reports a division by zero."]))

    return user, "undefined: division by zero", [("zero", "ZeroDivisionError")], [], solve


def _typo_key(rng: random.Random, key: str, keys: list[str]) -> str | None:
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
    typo = _typo_key(rng, key, keys) if rng.random() < 0.3 else None

    def solve(p: _Play) -> None:
        pre = ["Looking up the key.", "Let me check the key-value store.", f"Fetching {key}."]
        if typo is not None:
            out = p.one(_say(p.rng, pre), "kv_get", {"key": typo})
            m = re.search(r"Did you mean '([^']+)'", out)
            if m and m.group(1) == key:
                fix = [f"That key does not exist; the error suggests '{key}'.", f"Wrong key. Retrying with {key}."]
            else:
                fix = [f"That key does not exist. The task asks for {key}, so I'll use that exact key."]
            p.one(p.rng.choice(fix), "kv_get", {"key": key})
        else:
            p.one(_say(p.rng, pre), "kv_get", {"key": key})
        p.answer(p.rng.choice([f"The value of {key} is {value}.", f"{key} = {value}",
                               f"It is set to {value}.", f"{key} is {value}."]))

    return user, value, [(value,)], [], solve


def _kind_kv_missing(rng: random.Random, world: World, split: str) -> Spec | None:
    key = f"{rng.choice(N.nouns(split))}.{rng.choice(N.ATTRS)}"
    if key in world.kv or "Did you mean" in execute(world, "kv_get", {"key": key}):
        return None
    user = rng.choice(["What is the value of key {k}?", "Look up {k} in the key-value store."]).format(k=key)

    def solve(p: _Play) -> None:
        p.one(_say(p.rng, ["Looking up the key."]), "kv_get", {"key": key})
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

    def solve(p: _Play) -> None:
        pre = ["Running the tests.", f"Let me run {mod.test_path}.", "I'll run the module's tests."]
        if wrong:
            bad = p.rng.choice([f"tests/{mod.name}.py", f"test_{mod.name}.py", f"tests/test_{mod.name}"])
            p.one(_say(p.rng, pre), "run_tests", {"path": bad})
            p.one(p.rng.choice([f"No tests there; the test file is {mod.test_path}.",
                                "Wrong path. Using the test file from the list."]),
                  "run_tests", {"path": mod.test_path})
        else:
            p.one(_say(p.rng, pre), "run_tests", {"path": mod.test_path})
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

    def solve(p: _Play) -> None:
        p.one(_say(p.rng, ["Running the whole suite.", "Let me run all the tests."]), "run_tests", {})
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

    def solve(p: _Play) -> None:
        if p.rng.random() < 0.5:
            p.one(_say(p.rng, ["Let me find the test first."]), "search_files", {"query": test})
            p.one(p.rng.choice([f"It lives in {mod.test_path}. Running it.", f"Running {mod.test_path}."]),
                  "run_tests", {"path": mod.test_path})
        else:
            p.one(_say(p.rng, ["Running its test file.", f"Running {mod.test_path}."]),
                  "run_tests", {"path": mod.test_path})
        if m:
            p.answer(p.rng.choice([f"{test} fails with: {reason}",
                                   f"It expects {m.group(1)} but the function returned {m.group(2)} ({reason})."]))
        else:
            p.answer(f"{test} fails with an exception: {reason}")

    return user, reason, required, [], solve


_ATTR_WORDS = {"port": "port", "timeout_ms": "timeout (timeout_ms)", "replicas": "number of replicas",
               "region": "region"}


def _find_service(p: _Play, svc, failure: bool) -> None:
    """Search for the service's config (maybe after a failed guess), then read it."""
    rng = p.rng
    noun = svc.name.split("-")[0]
    if failure and rng.random() < 0.5:
        guess = rng.choice([f"services/{svc.name}/config.yaml", f"config/{svc.name}.yaml",
                            f"{svc.name}.yaml", f"deploy/{svc.name}.yaml"])
        if guess != svc.path:
            out = p.one(_say(rng, [f"I'll try the usual config path for {svc.name}."], 0.2),
                        "read_file", {"path": guess})
            m = re.search(r"Did you mean '([^']+)'", out)
            if m and m.group(1) == svc.path:
                p.one(f"Not found; the error suggests {svc.path}.", "read_file", {"path": svc.path})
                return
            p.one(rng.choice(["That file does not exist. Searching instead.", "Wrong guess; let me search."]),
                  "search_files", {"query": f"service: {svc.name}"})
            p.one(_say(rng, [f"It is defined in {svc.path}."], 0.3), "read_file", {"path": svc.path})
            return
    if failure:
        p.one(_say(rng, ["Searching for it."]), "search_files", {"query": f"{svc.name} service"})
        p.one(rng.choice(["No matches. Trying just the name.", "Too specific; searching for the name only."]),
              "search_files", {"query": svc.name})
    else:
        query = rng.choice([svc.name, f"service: {svc.name}", svc.name, noun])
        p.one(_say(rng, [f"Let me find where {svc.name} is defined.", "Searching the repository."]),
              "search_files", {"query": query})
    p.one(_say(rng, [f"{svc.path} defines it. Reading it.", f"The definition is in {svc.path}."], 0.3),
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

    def solve(p: _Play) -> None:
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

    def solve(p: _Play) -> None:
        if by_path:
            p.one(_say(p.rng, [f"Reading {mod.path}."]), "read_file", {"path": mod.path})
        else:
            if p.rng.random() < 0.4:
                guess = f"src/{mod.name}.py"
                p.one(_say(p.rng, ["Let me open the module."]), "read_file", {"path": guess})
                p.one("Not there. Searching for the module file.", "search_files", {"query": f"{const} ="})
            else:
                p.one(_say(p.rng, ["Searching for the constant."]), "search_files", {"query": const})
            p.one(_say(p.rng, [f"The module is {mod.path}."], 0.3), "read_file", {"path": mod.path})
        p.answer(p.rng.choice([f"{const} is {value} in {mod.path}.", f"{const} = {value}",
                               f"It is set to {value}."]))

    return user, str(value), [(str(value),)], [], solve


def _kind_kv_calc(rng: random.Random, world: World, split: str) -> Spec | None:
    numeric = [k for k, v in world.kv.items() if v.isdigit()]
    if len(numeric) < 2:
        return None
    k1, k2 = rng.sample(numeric, 2)
    v1, v2 = world.kv[k1], world.kv[k2]
    op, word = rng.choice([("+", "the sum of {a} and {b}"), ("*", "{a} multiplied by {b}"),
                           ("-", "{a} minus {b}"), ("+", "{a} plus {b}")])
    single = rng.random() < 0.25
    if single:
        factor = rng.randint(2, 12)
        expr = f"{v1} * {factor}"
        user = rng.choice(["What is {a} times {f}?", "Multiply the value of {a} by {f}."]).format(a=k1, f=factor)
    else:
        expr = f"{v1} {op} {v2}"
        user = rng.choice(["What is " + word + "?", "Compute " + word + ".",
                           "Look up {a} and {b} and give me " + word.replace("{a}", "the first").replace(
                               "{b}", "the second") + "."]).format(a=k1, b=k2)
    result = calculator(expr)
    parallel = rng.random() < 0.3
    typo = _typo_key(rng, k1, list(world.kv)) if rng.random() < 0.2 else None

    def solve(p: _Play) -> None:
        if typo is not None:
            p.one(_say(p.rng, ["First the values."]), "kv_get", {"key": typo})
            p.one(f"Wrong key; retrying with {k1}.", "kv_get", {"key": k1})
        if single:
            if typo is None:
                p.one(_say(p.rng, [f"Fetching {k1}."]), "kv_get", {"key": k1})
        elif parallel and typo is None:
            p.call(_say(p.rng, ["Fetching both values."]), ("kv_get", {"key": k1}), ("kv_get", {"key": k2}))
        else:
            if typo is None:
                p.one(_say(p.rng, [f"Fetching {k1} first."]), "kv_get", {"key": k1})
            p.one(_say(p.rng, [f"{k1} is {v1}. Now {k2}."], 0.3), "kv_get", {"key": k2})
        p.one(_say(p.rng, [f"Computing {expr}."], 0.3), "calculator", {"expression": expr})
        p.answer(p.rng.choice([f"{expr} = {result}.", f"The result is {result}.",
                               f"The answer is {result} ({k1} = {v1}" + ("" if single else f", {k2} = {v2}") + ")."]))

    return user, result, [(result,)], [], solve


def _kind_compare(rng: random.Random, world: World, split: str) -> Spec | None:
    svcs = list(world.services.values())
    if len(svcs) < 2:
        return None
    chosen = rng.sample(svcs, min(len(svcs), rng.choice([2, 3, 3])))
    attr = rng.choice(["timeout_ms", "replicas", "port"])
    values = [getattr(s, attr) for s in chosen]
    if len(set(values)) < len(values):
        return None
    best = max(chosen, key=lambda s: getattr(s, attr))
    listing = ", ".join(s.name for s in chosen[:-1]) + " and " + chosen[-1].name
    user = rng.choice(["Which of {l} has the largest {a}?", "Among {l}, which service has the highest {a}?",
                       "Compare the {a} of {l}: which is largest?"]).format(l=listing, a=attr)

    def solve(p: _Play) -> None:
        p.one(_say(p.rng, ["First I'll find where each service is defined.", "Locating the configs."], 0.2),
              "search_files", {"query": "service:"})
        for s in chosen:
            p.one(_say(p.rng, [f"Reading {s.name}'s config.", f"Now {s.path}."], 0.3), "read_file", {"path": s.path})
        detail = ", ".join(f"{s.name} {getattr(s, attr)}" for s in chosen)
        p.answer(p.rng.choice([f"{best.name} has the largest {attr}: {getattr(best, attr)} ({detail}).",
                               f"{best.name}, with {attr} {getattr(best, attr)}."]))

    return user, best.name, [(best.name,), (str(getattr(best, attr)),)], [], solve


def _kind_port_sum(rng: random.Random, world: World, split: str) -> Spec | None:
    svcs = list(world.services.values())
    if len(svcs) < 2:
        return None
    a, b = rng.sample(svcs, 2)
    attr = rng.choice(["port", "timeout_ms", "replicas"])
    va, vb = getattr(a, attr), getattr(b, attr)
    op = rng.choice(["+", "-"])
    expr = f"{va} {op} {vb}"
    result = calculator(expr)
    user = (f"What is the {attr} of {a.name} {'plus' if op == '+' else 'minus'} the {attr} of {b.name}?"
            if rng.random() < 0.5 else
            f"Compute {a.name}'s {attr} {'+' if op == '+' else '-'} {b.name}'s {attr}.")

    def solve(p: _Play) -> None:
        p.one(_say(p.rng, ["Let me locate both configs."], 0.2), "search_files", {"query": "service:"})
        p.one(_say(p.rng, [f"Reading {a.path}."], 0.3), "read_file", {"path": a.path})
        p.one(_say(p.rng, [f"{a.name} has {attr} {va}. Now {b.path}."], 0.3), "read_file", {"path": b.path})
        p.one(_say(p.rng, [f"Computing {expr}."], 0.3), "calculator", {"expression": expr})
        p.answer(p.rng.choice([f"{expr} = {result}.", f"The result is {result} ({a.name}: {va}, {b.name}: {vb})."]))

    return user, result, [(result,)], [], solve


ORDER_PROMPTS = [
    "You are an order assistant. Use read_file and calculator; answer with the total.",
    "You are an order assistant. Use the tools and answer with the total.",
    "You help customers with their orders. Read the files you need and compute totals with the calculator.",
    "You are a billing assistant. Use read_file and calculator.",
]
ORDER_QUESTIONS = [
    "What does order #{n} in prices.csv cost with the discount and shipping from the config?",
    "How much does order #{n} (prices.csv) cost after the discount, shipping included?",
    "Compute the total of order #{n} in prices.csv: apply the configured discount, then add shipping.",
    "What is the final price of order #{n} in prices.csv (discount and shipping from the config)?",
]
_CURRENCIES = ["EUR", "USD", "GBP", "CHF"]


def _order_world(rng: random.Random, world: World, split: str) -> dict:
    """Adds ``config.ini``, ``prices.csv`` and ``notes.txt`` (an order) to the world."""
    pool = N.nouns(split)
    items = [f"{rng.choice(pool)}-{rng.randint(1, 60):02d}" for _ in range(rng.randint(2, 5))]
    prices = [f"{rng.choice([rng.randint(1, 40) + rng.choice([0.25, 0.5, 0.75, 0.0]), rng.randint(100, 4999) / 100]):.2f}"
              for _ in items]
    qty = [rng.randint(1, 6) for _ in items]
    discount = rng.choice(["0.05", "0.1", "0.15", "0.2", "0.25", "0.3"])
    shipping = rng.choice(["0", "4.5", "5", "7.5", "9.9", "12", "3.25"])
    currency = rng.choice(_CURRENCIES)
    world.files["config.ini"] = f"[order]\ncurrency = {currency}\ndiscount = {discount}\nshipping = {shipping}\n"
    world.files["prices.csv"] = "item,unit_price,quantity\n" + "".join(
        f"{i},{p},{q}\n" for i, p, q in zip(items, prices, qty))
    days = sorted(rng.sample(range(1, 29), rng.randint(3, 8)))
    world.files["notes.txt"] = "".join(f"{d}: customer asked about {rng.choice(items)}, answered by ops\n"
                                       for d in days)
    return {"items": items, "prices": prices, "qty": qty, "discount": discount, "shipping": shipping,
            "currency": currency}


def _order_transcript(rng: random.Random, world: World, split: str, seed: int) -> Transcript:
    """An "order" task: read the config and the price list, compute the total in steps.

    Like ``examples/langgraph_agent.py``: its two tools (:data:`.tools.ORDER_TOOLS`), the API
    prompt layout, a wrong first guess at the config's file name now and then, a calculator
    call per step. Item names come from the split's noun pool; all numbers are drawn per task.
    """
    o = _order_world(rng, world, split)
    messages = api_head(ORDER_TOOLS, rng.choice(ORDER_PROMPTS))
    user = rng.choice(ORDER_QUESTIONS).format(n=rng.randint(10, 999))
    messages.append(Message(role="user", content=user))
    play = _Play(world, rng, messages)
    subtotal_expr = " + ".join(f"{p} * {q}" for p, q in zip(o["prices"], o["qty"]))
    subtotal = calculator(subtotal_expr)
    discounted_expr = f"{subtotal} * (1 - {o['discount']})"
    discounted = calculator(discounted_expr)
    total_expr = f"{discounted} + {o['shipping']}"
    total = calculator(total_expr)
    if rng.random() < 0.4:
        play.one(_say(rng, ["First the config."]), "read_file", {"path": rng.choice(["config.txt", "config.yaml",
                                                                                    "order.ini"])})
        play.one(_say(rng, ["Wrong file name; the config is config.ini."], 0.3), "read_file", {"path": "config.ini"})
    else:
        play.one(_say(rng, ["First the config.", "Reading the discount and shipping."]), "read_file",
                 {"path": "config.ini"})
    play.one(_say(rng, [f"Discount {o['discount']}, shipping {o['shipping']}. Now the prices."], 0.3),
             "read_file", {"path": "prices.csv"})
    play.one(_say(rng, ["Subtotal: unit price times quantity, summed."], 0.4), "calculator",
             {"expression": subtotal_expr})
    if rng.random() < 0.5:
        play.one(_say(rng, [f"Subtotal {subtotal}; applying the {o['discount']} discount."], 0.4), "calculator",
                 {"expression": discounted_expr})
        play.one(_say(rng, [f"Adding shipping {o['shipping']}."], 0.4), "calculator", {"expression": total_expr})
    else:
        total_expr = f"{subtotal} * (1 - {o['discount']}) + {o['shipping']}"
        total = calculator(total_expr)
        play.one(_say(rng, [f"Subtotal {subtotal}; applying the discount and adding shipping."], 0.4),
                 "calculator", {"expression": total_expr})
    play.answer(rng.choice([f"The order costs {total} {o['currency']}.", f"The total is {total} {o['currency']}.",
                            f"{total} {o['currency']} (subtotal {subtotal}, discount {o['discount']}, "
                            f"shipping {o['shipping']})."]))
    task = Task(task_id=f"{split}-{seed}", split=split, kind="order", messages=messages[:3], tools=ORDER_TOOLS,
                world=world, expected=total, required=[(total,)])
    return Transcript(tasks=[task], messages=play.messages)


def _custom_tool_transcript(rng: random.Random, world: World, split: str, seed: int) -> Transcript:
    """A "custom_tool" task (:mod:`.custom_tools`): the caller's own tool, run by the world."""
    made = make_custom_tool_task(rng, split)
    world.custom_tools.update({t.name: t for t in made.tools})
    task = Task(task_id=f"{split}-{seed}", split=split, kind="custom_tool", messages=list(made.messages),
                tools=[t.spec for t in made.tools], world=world, expected=made.expected,
                required=[(made.expected,)])
    return Transcript(tasks=[task], messages=made.messages + made.solution)


KINDS: dict[str, tuple[float, Callable[[random.Random, World, str], Spec | None]]] = {
    "calc": (13, _kind_calc),
    "div_zero": (2, _kind_div_zero),
    "kv": (13, _kind_kv),
    "kv_missing": (3, _kind_kv_missing),
    "tests": (11, _kind_tests),
    "tests_all": (5, _kind_tests_all),
    "tests_reason": (6, _kind_tests_reason),
    "service_attr": (14, _kind_service_attr),
    "constant": (8, _kind_constant),
    "kv_calc": (10, _kind_kv_calc),
    "compare": (8, _kind_compare),
    "port_sum": (7, _kind_port_sum),
}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")


MAX_CHAIN_CHARS = 6300  # keeps a chained transcript within a 2048-token row


def _pick_spec(rng: random.Random, world: World, split: str, kind: str | None, seed: int):
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    for _attempt in range(50):
        chosen = kind or rng.choices(kinds, weights)[0]
        spec = KINDS[chosen][1](rng, world, split)
        if spec is not None:
            return chosen, spec
    raise RuntimeError(f"could not build a {kind} task for seed {seed}")


def _chars(messages: list[Message]) -> int:
    return sum(len(m.content) + sum(len(c.function.arguments) + 40 for c in m.tool_calls or []) + 10
               for m in messages)


def make_transcript(seed: int, split: str = "train", kind: str | None = None,
                    mix: TaskMix = TaskMix()) -> Transcript:
    """One task and its worked solution; a pure function of ``(seed, split, kind)``.

    About a third of the transcripts go on with one or two follow-up tasks in
    the same world (long, multi-task agent histories up to ~2k tokens); those
    follow-ups are in ``Transcript.tasks`` with their whole history as messages.
    """
    _check_split(split)
    rng = random.Random(f"transcript:{split}:{seed}")
    world = make_world(str(seed), split)
    # A separate stream, so adding these choices left every other transcript as it was.
    dice = random.Random(f"layout:{split}:{seed}")
    if kind == "order" or (kind is None and dice.random() < mix.order_share):
        return _order_transcript(rng, world, split, seed)
    # Drawn only when asked for, so recipes without custom tools get the same transcripts as before.
    if kind == "custom_tool" or (kind is None and mix.custom_tool_share and dice.random() < mix.custom_tool_share):
        return _custom_tool_transcript(rng, world, split, seed)
    api = dice.random() < mix.api_share
    messages = api_head(TOOLS, SYSTEM_PROMPT) if api else [system_message()]
    play = _Play(world, rng, messages)
    tasks: list[Task] = []
    n_parts = 1 + (rng.choice([1, 1, 2]) if rng.random() < 0.35 else 0)
    for part in range(n_parts):
        chosen, (user, expected, required, forbidden, solve) = _pick_spec(
            rng, world, split, kind if part == 0 else None, seed)
        if part:
            user = rng.choice(["", "", "Thanks. ", "Next question: ", "Another one. ", "Now: "]) + user
        before = len(play.messages)
        play.messages.append(Message(role="user", content=user))
        task = Task(task_id=f"{split}-{seed}" + (f".{part}" if part else ""), split=split, kind=chosen,
                    messages=list(play.messages), tools=TOOLS, world=world, expected=expected,
                    required=required, forbidden=forbidden)
        solve(play)
        if part and _chars(play.messages) > MAX_CHAIN_CHARS:
            del play.messages[before:]  # too long for one row: drop this follow-up
            break
        tasks.append(task)
    return Transcript(tasks=tasks, messages=play.messages)


def make_task(seed: int, split: str = "test", kind: str | None = None, mix: TaskMix = TaskMix()) -> Task:
    return make_transcript(seed, split, kind, mix).task


