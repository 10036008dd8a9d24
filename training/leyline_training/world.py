"""Per-task generated worlds: a small file tree, a key-value store, real tests.

A :class:`World` is a pure function of ``(seed, split)``. It holds

* service configs (YAML-ish, 30-80 lines) under a few path layouts,
* Python modules with small arithmetic functions (some with a real bug) and
  their test files, which :func:`leyline_training.tools.run_tests`
  executes for real,
* notes in markdown mentioning the entities,
* a key-value store.

Entity names come from the split's noun pool (:mod:`.names`), so the test
split's worlds share no entity name with the training split's.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import names as N

if TYPE_CHECKING:
    from .custom_tools import CustomTool


@dataclass
class Service:
    name: str
    path: str  # the config file that defines it
    port: int
    timeout_ms: int
    replicas: int
    region: str
    owner: str


@dataclass
class Function:
    name: str
    params: tuple[str, str]
    lines: list[str]  # body lines as shipped (maybe buggy), without the def line
    correct: list[str]  # body lines of the intended implementation
    doc: str


@dataclass
class Module:
    name: str  # e.g. "orchard_sync"
    path: str  # e.g. "src/billing/orchard_sync.py"
    test_path: str  # e.g. "tests/test_orchard_sync.py"
    constants: dict[str, int]
    functions: list[Function]
    tests: list[tuple[str, str, tuple[int, int]]]  # (test name, function name, args)


@dataclass
class World:
    seed: str
    split: str
    files: dict[str, str] = field(default_factory=dict)
    kv: dict[str, str] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    modules: dict[str, Module] = field(default_factory=dict)
    package: str = ""
    custom_tools: dict[str, CustomTool] = field(default_factory=dict)  # a "custom_tool" task's own tools


# --------------------------------------------------------------------------- helpers


def _funcs_namespace() -> dict:
    return {"__builtins__": {"min": min, "max": max, "abs": abs}}


def function_source(fn: Function, body: list[str] | None = None) -> str:
    body = fn.lines if body is None else body
    p, q = fn.params
    out = [f"def {fn.name}({p}, {q}):", f'    """{fn.doc}"""']
    out += ["    " + line for line in body]
    return "\n".join(out)


@functools.lru_cache(maxsize=8192)
def _compiled(source: str, name: str):
    ns = _funcs_namespace()
    exec(compile(source, f"<{name}>", "exec"), ns)  # noqa: S102 -- our own generated code
    return ns[name]


def call_function(fn: Function, args: tuple[int, int], body: list[str] | None = None):
    """Run the function's source (shipped or intended body) for real."""
    return _compiled(function_source(fn, body), fn.name)(*args)


_PARAMS = [("a", "b"), ("x", "y"), ("price", "rate"), ("count", "size"), ("value", "factor"),
           ("base", "extra"), ("left", "right"), ("total", "step")]


def _body_forms(p: str, q: str, k1: int, k2: int) -> list[list[str]]:
    return [
        [f"total = {p} + {q}", f"return total * {k1}"],
        [f"scaled = {p} * {k1}", f"return scaled - {q}"],
        [f"diff = {p} - {q}", f"return diff * diff + {k2}"],
        [f"part = {p} // {k1}", f"return part + {q} * {k1}"],
        [f"return ({p} + {k2}) * {q} % {k1 + 7}"],
        [f"low = min({p}, {q})", f"high = max({p}, {q})", f"return high - low + {k2}"],
        [f"if {p} > {q}:", f"    return {p} - {q}", f"return {q} * {k1}"],
        [f"acc = {p} * {q}", f"acc = acc + {k2}", f"return acc // {k1}"],
        [f"return abs({p} - {q} * {k1}) + {k2}"],
    ]


_OP_SWAPS = [(" + ", " - "), (" - ", " + "), (" * ", " + "), (" // ", " % "), (" > ", " < "),
             ("min(", "max("), ("max(", "min(")]


def _mutate(rng: random.Random, lines: list[str], params: tuple[str, str]) -> list[str]:
    """One realistic bug: a swapped operator, an off-by-one constant or a typo'd name."""
    out = list(lines)
    kind = rng.random()
    idx = rng.randrange(len(out))
    line = out[idx]
    if kind < 0.15:
        # a typo in a variable name -> NameError when the line runs
        var = rng.choice(params)
        if re.search(rf"\b{var}\b", line) and len(var) > 1:
            typo = var[:-1] if len(var) > 2 else var + var[-1]
            out[idx] = re.sub(rf"\b{var}\b", typo, line, count=1)
            return out
    if kind < 0.55:
        nums = list(re.finditer(r"\b\d+\b", line))
        if nums:
            m = rng.choice(nums)
            orig = int(m.group())
            val = orig + 1 if orig <= 2 else orig + rng.choice([-1, 1])
            out[idx] = line[:m.start()] + str(val) + line[m.end():]
            return out
    swaps = [s for s in _OP_SWAPS if s[0] in line]
    if swaps:
        a, b = rng.choice(swaps)
        out[idx] = line.replace(a, b, 1)
        return out
    nums = list(re.finditer(r"\b\d+\b", line))
    if nums:
        m = nums[0]
        out[idx] = line[:m.start()] + str(int(m.group()) + 1) + line[m.end():]
    return out


def _make_function(rng: random.Random, name: str, noun: str) -> Function:
    p, q = rng.choice(_PARAMS)
    k1, k2 = rng.randint(2, 9), rng.randint(1, 30)
    body = rng.choice(_body_forms(p, q, k1, k2))
    doc = rng.choice([
        f"Return the {noun} score for {p} and {q}.",
        f"Compute the adjusted {noun} value from {p} and {q}.",
        f"Combine {p} and {q} into a {noun} figure.",
        f"Helper used by the {noun} pipeline.",
    ])
    return Function(name=name, params=(p, q), lines=list(body), correct=list(body), doc=doc)


def _make_module(rng: random.Random, split: str, package: str, noun: str, suffix: str,
                 used_func_names: set[str]) -> Module:
    mod_name = f"{noun}_{suffix}"
    path = f"src/{package}/{mod_name}.py"
    test_path = f"tests/test_{mod_name}.py"
    n_funcs = rng.randint(2, 4)
    functions: list[Function] = []
    for _ in range(n_funcs):
        for _try in range(20):
            fname = f"{rng.choice(N.VERBS)}_{noun if rng.random() < 0.5 else rng.choice(N.nouns(split))}"
            if fname not in used_func_names:
                break
        used_func_names.add(fname)
        functions.append(_make_function(rng, fname, noun))
    tests = []
    for fn in functions:
        cases = rng.sample(N.TEST_CASES, rng.randint(2, 3))
        for case in cases:
            args = (rng.randint(0, 40), rng.randint(1, 25))
            if case == "zero":
                args = (0, args[1])
            elif case == "negative":
                args = (-args[0] - 1, args[1])
            elif case == "large":
                args = (args[0] * 37 + 100, args[1] * 11)
            elif case == "identity":
                args = (args[0], 1)
            tests.append((f"test_{fn.name}_{case}", fn.name, args))
    # Bugs: most modules have 0-2 buggy functions; a bug counts only if a test sees it.
    n_bugs = rng.choice([0, 1, 1, 1, 2, 2])
    for fn in rng.sample(functions, min(n_bugs, len(functions))):
        for _try in range(10):
            mutated = _mutate(rng, fn.correct, fn.params)
            if mutated == fn.correct:
                continue
            try:
                compile(function_source(fn, mutated), "<bug>", "exec")
            except SyntaxError:
                continue
            fn.lines = mutated
            break
    constants = {}
    for cname in rng.sample(["MAX_RETRIES", "DEFAULT_TIMEOUT_MS", "BATCH_SIZE", "CACHE_TTL_S", "PAGE_SIZE",
                             "MAX_WORKERS", "RETRY_DELAY_MS", f"{noun.upper()}_LIMIT"], rng.randint(2, 4)):
        constants[cname] = rng.choice([rng.randint(2, 12), rng.randint(10, 500), rng.randint(100, 9000)])
    return Module(name=mod_name, path=path, test_path=test_path, constants=constants,
                  functions=functions, tests=tests)


def module_source(mod: Module, package: str, owner: str) -> str:
    lines = [f'"""{mod.name.replace("_", " ").capitalize()} helpers for the {package} package.', "",
             f"Maintained by {owner}. Functions here are pure and deterministic.", '"""', "",
             "from __future__ import annotations", ""]
    for cname, value in mod.constants.items():
        lines.append(f"{cname} = {value}")
    for fn in mod.functions:
        lines += ["", "", function_source(fn)]
    return "\n".join(lines) + "\n"


def test_source(mod: Module, package: str) -> str:
    fnames = ", ".join(fn.name for fn in mod.functions)
    lines = [f"from src.{package}.{mod.name} import {fnames}", ""]
    by_name = {fn.name: fn for fn in mod.functions}
    for tname, fname, args in mod.tests:
        expected = call_function(by_name[fname], args, by_name[fname].correct)
        lines += ["", f"def {tname}():", f"    assert {fname}({args[0]}, {args[1]}) == {expected}"]
    return "\n".join(lines) + "\n"


def _service_config(rng: random.Random, svc: Service, others: list[str], split: str) -> str:
    lines = [f"# Service configuration for {svc.name}", f"# Owner: {svc.owner}"]
    if rng.random() < 0.5:
        lines.append(f"# Last reviewed by the {rng.choice(N.nouns(split))} team")
    lines += ["", f"service: {svc.name}", f"version: {rng.randint(1, 4)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
              f"host: {svc.name}.internal", f"port: {svc.port}", f"timeout_ms: {svc.timeout_ms}",
              f"replicas: {svc.replicas}", f"region: {svc.region}"]
    sections = []
    db = rng.choice(N.nouns(split))
    sections.append(["database:", f"  host: {db}-db.internal", f"  name: {db}_main",
                     f"  pool_size: {rng.randint(4, 64)}", f"  ssl: {rng.choice(['true', 'false'])}",
                     f"  statement_timeout_ms: {rng.randint(500, 30000)}"])
    sections.append(["cache:", f"  backend: {rng.choice(['redis', 'memcached', 'local'])}",
                     f"  ttl_seconds: {rng.randint(30, 86400)}", f"  max_entries: {rng.randint(100, 100000)}"])
    sections.append(["logging:", f"  level: {rng.choice(N.LOG_LEVELS)}",
                     f"  format: {rng.choice(['json', 'text', 'logfmt'])}",
                     f"  file: /var/log/{svc.name}.log", f"  rotate_mb: {rng.randint(10, 500)}"])
    sections.append(["limits:", f"  rate_limit: {rng.randint(10, 5000)}", f"  burst: {rng.randint(5, 500)}",
                     f"  queue_depth: {rng.randint(16, 4096)}", f"  max_connections: {rng.randint(10, 2000)}"])
    sections.append(["retry:", f"  max_retries: {rng.randint(0, 10)}",
                     f"  backoff_ms: {rng.randint(50, 5000)}", f"  jitter: {rng.choice(['true', 'false'])}"])
    deps = rng.sample(others, min(len(others), rng.randint(0, 3)))
    if deps:
        sections.append(["dependencies:"] + [f"  - {d}" for d in deps])
    flags = rng.sample([f"{w}_{s}" for w in ("enable", "use", "allow", "skip") for s in
                        ("tracing", "compression", "batching", "prefetch", "audit", "sharding", "backfill")],
                       rng.randint(2, 6))
    sections.append(["features:"] + [f"  - {f}" for f in flags])
    sections.append(["env:"] + [f"  {k}: {v}" for k, v in [
        ("WORKERS", rng.randint(1, 32)), ("GOMAXPROCS", rng.randint(1, 16)),
        ("HEAP_MB", rng.randint(128, 8192)), ("FEATURE_LEVEL", rng.randint(1, 5))][:rng.randint(1, 4)]])
    sections.append(["metrics:", f"  enabled: {rng.choice(['true', 'false'])}",
                     "  path: /metrics", f"  interval_s: {rng.randint(5, 120)}"])
    sections.append(["healthcheck:", f"  path: /{rng.choice(['healthz', 'health', 'ready'])}",
                     f"  interval_s: {rng.randint(2, 60)}", f"  failure_threshold: {rng.randint(1, 10)}"])
    rng.shuffle(sections)
    target = rng.randint(30, 80)
    for sec in sections:
        if len(lines) + len(sec) + 1 > target and len(lines) >= 30:
            break
        lines.append("")
        lines += sec
    while len(lines) < 30:
        lines.append(f"# note: {rng.choice(N.nouns(split))} {rng.choice(['rollout', 'migration', 'review', 'audit'])}"
                     f" {rng.randint(1, 99)}")
    return "\n".join(lines) + "\n"


def _note(rng: random.Random, topic: str, services: list[Service], split: str) -> str:
    lines = [f"# {topic.capitalize()} notes", ""]
    for _ in range(rng.randint(3, 10)):
        svc = rng.choice(services)
        lines.append(rng.choice([
            f"- {svc.name} is owned by {svc.owner}.",
            f"- {svc.name} runs in {svc.region} with {svc.replicas} replicas.",
            f"- TODO: review the {topic} rollout for {svc.name}.",
            f"- The {rng.choice(N.nouns(split))} migration finished on day {rng.randint(1, 28)}.",
            f"- Incident {rng.randint(100, 999)}: {svc.name} timed out under load.",
            f"- {svc.name} depends on {rng.choice([s for s in services if s is not svc] or [svc]).name}.",
        ]))
    return "\n".join(lines) + "\n"


def _kv_value(rng: random.Random, attr: str, split: str) -> str:
    if attr == "owner":
        return f"team-{rng.choice(N.nouns(split))}"
    if attr == "region":
        return rng.choice(N.REGIONS)
    if attr == "version":
        return f"{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"
    if attr == "endpoint":
        return f"https://{rng.choice(N.nouns(split))}.example.com/{rng.choice(['v1', 'v2', 'api'])}"
    if attr == "log_level":
        return rng.choice(N.LOG_LEVELS)
    if attr == "port":
        return str(rng.randint(1024, 65000))
    return str(rng.choice([rng.randint(1, 20), rng.randint(10, 999), rng.randint(100, 99999)]))


NUMERIC_ATTRS = [a for a in N.ATTRS if a not in ("owner", "region", "version", "endpoint", "log_level")]


def make_world(seed: str, split: str) -> World:
    rng = random.Random(f"world:{split}:{seed}")
    world = World(seed=seed, split=split)
    pool = N.nouns(split)
    # services
    svc_nouns = rng.sample(pool, rng.randint(3, 6))
    layout = rng.choice(["services", "deploy", "config"])
    env = rng.choice(N.ENVS)
    used_names = set()
    for i, noun in enumerate(svc_nouns):
        name = f"{noun}-{rng.choice(N.SERVICE_SUFFIXES)}"
        used_names.add(name)
        if layout == "services":
            path = f"services/{noun}/config.yaml"
        elif layout == "deploy":
            path = f"deploy/{env}/{noun}.yaml"
        else:
            path = f"config/{noun}-{rng.randint(1, 9)}.yaml"
        world.services[name] = Service(
            name=name, path=path, port=rng.randint(1024, 65000),
            timeout_ms=rng.choice([rng.randint(100, 9999), rng.randint(10, 60) * 100]),
            replicas=rng.randint(1, 12), region=rng.choice(N.REGIONS),
            owner=f"team-{rng.choice(pool)}")
    names_list = list(world.services)
    for svc in world.services.values():
        others = [n for n in names_list if n != svc.name]
        world.files[svc.path] = _service_config(rng, svc, others, split)
    # modules
    world.package = rng.choice(pool)
    used_funcs: set[str] = set()
    for noun in rng.sample(pool, rng.randint(2, 4)):
        mod = _make_module(rng, split, world.package, noun, rng.choice(["sync", "utils", "core", "math", "rules",
                                                                          "stats", "pricing", "metrics"]), used_funcs)
        if mod.name in world.modules:
            continue
        world.modules[mod.name] = mod
        owner = f"team-{rng.choice(pool)}"
        world.files[mod.path] = module_source(mod, world.package, owner)
        world.files[mod.test_path] = test_source(mod, world.package)
    # notes
    services = list(world.services.values())
    for topic in rng.sample(pool, rng.randint(1, 3)):
        world.files[f"notes/{topic}.md"] = _note(rng, topic, services, split)
    world.files["README.md"] = (f"# {world.package} monorepo\n\nServices: {', '.join(names_list)}.\n"
                                f"Run the tests with run_tests.\n")
    # key-value store
    for noun in rng.sample(pool, rng.randint(4, 8)):
        for attr in rng.sample(N.ATTRS, rng.randint(1, 3)):
            sep = rng.choice([".", "_", "."])
            world.kv[f"{noun}{sep}{attr}"] = _kv_value(rng, attr, split)
    world.files = dict(sorted(world.files.items()))
    return world
