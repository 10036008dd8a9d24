"""Task kinds that chain tools: a key's value into a calculation, two services compared, two ports summed."""

from __future__ import annotations

import random

from .task_kinds_single import typo_key
from .task_play import Play, Spec, say
from .tools import calculator
from .world import World


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
    typo = typo_key(rng, k1, list(world.kv)) if rng.random() < 0.2 else None

    def solve(p: Play) -> None:
        if typo is not None:
            p.one(say(p.rng, ["First the values."]), "kv_get", {"key": typo})
            p.one(f"Wrong key; retrying with {k1}.", "kv_get", {"key": k1})
        if single:
            if typo is None:
                p.one(say(p.rng, [f"Fetching {k1}."]), "kv_get", {"key": k1})
        elif parallel and typo is None:
            p.call(say(p.rng, ["Fetching both values."]), ("kv_get", {"key": k1}), ("kv_get", {"key": k2}))
        else:
            if typo is None:
                p.one(say(p.rng, [f"Fetching {k1} first."]), "kv_get", {"key": k1})
            p.one(say(p.rng, [f"{k1} is {v1}. Now {k2}."], 0.3), "kv_get", {"key": k2})
        p.one(say(p.rng, [f"Computing {expr}."], 0.3), "calculator", {"expression": expr})
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

    def solve(p: Play) -> None:
        p.one(say(p.rng, ["First I'll find where each service is defined.", "Locating the configs."], 0.2),
              "search_files", {"query": "service:"})
        for s in chosen:
            p.one(say(p.rng, [f"Reading {s.name}'s config.", f"Now {s.path}."], 0.3), "read_file", {"path": s.path})
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

    def solve(p: Play) -> None:
        p.one(say(p.rng, ["Let me locate both configs."], 0.2), "search_files", {"query": "service:"})
        p.one(say(p.rng, [f"Reading {a.path}."], 0.3), "read_file", {"path": a.path})
        p.one(say(p.rng, [f"{a.name} has {attr} {va}. Now {b.path}."], 0.3), "read_file", {"path": b.path})
        p.one(say(p.rng, [f"Computing {expr}."], 0.3), "calculator", {"expression": expr})
        p.answer(p.rng.choice([f"{expr} = {result}.", f"The result is {result} ({a.name}: {va}, {b.name}: {vb})."]))

    return user, result, [(result,)], [], solve
