"""``leyline-bench grammar``: what constrained decoding costs per token.

Arms, interleaved round by round on the default model, each generating up to
``--tokens`` tokens at temperature 1 (seeded) through ``Runtime.generate`` with
the processors the chat route would build:

* ``free``: no processor (the native route without constraints);
* ``no_tools``: the control-token mask (a chat request without tools);
* ``tools_required``: the llguidance grammar for three tools, ``tool_choice=required``;
* ``json_schema``: the grammar for a ``response_format`` JSON schema;
* ``json_schema_closing``: the same, knowing the budget (as the chat route builds it): within
  the budget's last 64 tokens it runs the closing walk every 4 tokens, and closes the reply
  in time to parse. With ``--tokens`` 64 that is the whole generation: the worst case.

Per token it reports the wall time of a whole decode step and, separately, the
time spent inside the processors (mask + advance), plus grammar compile times
(cold, and from the cache).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from leyline_runtime.engine.grammar import GrammarCompiler
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.server.constraints import plan_decoding
from leyline_runtime.api.chat_request import DecodingFields
from leyline_sdk.protocol import GenerateRequest, Message, SessionCreate

from ..common.output import md_table, write_results

TOOLS = [
    {"type": "function", "function": {"name": "book_flight", "parameters": {
        "type": "object", "required": ["origin", "destination", "seats"],
        "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                       "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                       "seats": {"type": "integer", "minimum": 1, "maximum": 9}}}}},
    {"type": "function", "function": {"name": "set_thermostat", "parameters": {
        "type": "object", "required": ["celsius", "room"],
        "properties": {"celsius": {"type": "number", "minimum": 5, "maximum": 30},
                       "room": {"enum": ["kitchen", "attic", "garage"]}}}}},
    {"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "required": ["expression"], "properties": {"expression": {"type": "string"}}}}},
]
SCHEMA = {"type": "object", "required": ["answer", "confidence"],
          "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}}}
ARMS: dict[str, dict[str, Any] | None] = {
    "free": None,
    "no_tools": {},
    "tools_required": {"tools": TOOLS, "tool_choice": "required"},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
    "json_schema_closing": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "r", "schema": SCHEMA}}},
}
BUDGETED = {"json_schema_closing"}  # arms whose grammar knows max_tokens
PROMPT = [Message(role="system", content="You are a helpful agent."),
          Message(role="user", content="Fly me from Oslo to Rome, two seats, and tell me the answer.")]


def add_parser(sub) -> None:
    p = sub.add_parser("grammar")
    p.add_argument("--tokens", type=int, default=64, help="max tokens per generation")
    p.add_argument("--rounds", type=int, default=8, help="generations per arm (interleaved)")
    p.set_defaults(run=run, quick_overrides={"tokens": 8, "rounds": 1})


class _Timed:
    """Wraps a processor and adds the time spent in it to ``spent``."""

    def __init__(self, inner: Any, spent: list[float]):
        self.inner, self.spent = inner, spent

    def __call__(self, logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner(logits, generated)
        self.spent.append(time.perf_counter() - t0)
        return out

    def accept(self, token: int) -> None:
        t0 = time.perf_counter()
        self.inner.accept(token)
        self.spent[-1] += time.perf_counter() - t0


def run(args, log=print) -> dict:
    runtime = Runtime(RuntimeConfig(max_cache_tokens=8192))
    compiler = GrammarCompiler(runtime.tokenizer)
    plans = {name: None if fields is None else plan_decoding(DecodingFields.model_validate(fields),
                                                             runtime.tokenizer, compiler)
             for name, fields in ARMS.items()}
    compile_ms = _compile_times(runtime, plans)
    stats: dict[str, dict[str, list[float]]] = {a: {"step": [], "processor": [], "tokens": []} for a in ARMS}
    for r in range(args.rounds):
        order = list(ARMS)[r % len(ARMS):] + list(ARMS)[:r % len(ARMS)]
        for arm in order:
            step, spent, n = _generate(runtime, compiler, plans[arm], args.tokens, seed=r, budgeted=arm in BUDGETED)
            stats[arm]["step"].append(step)
            stats[arm]["processor"].append(sum(spent) / max(n, 1))
            stats[arm]["tokens"].append(n)
    results = {}
    for arm, s in stats.items():
        step_ms = statistics.median(s["step"]) * 1e3
        proc_us = statistics.median(s["processor"]) * 1e6
        results[arm] = {"step_ms_per_token": step_ms, "processor_us_per_token": proc_us,
                        "processor_share": proc_us / 1e3 / step_ms if step_ms else None,
                        "tokens": sum(s["tokens"])}
        log(f"grammar {arm}: {step_ms:.2f} ms/token, processors {proc_us:.0f} us/token")
    free = results["free"]["step_ms_per_token"]
    for arm in results:
        results[arm]["step_vs_free"] = results[arm]["step_ms_per_token"] / free if free else None
    result = {"benchmark": "grammar", "settings": {"tokens": args.tokens, "rounds": args.rounds},
              "library": _library(), "compile_ms": compile_ms, "results": results,
              "notes": ["step = wall time of Runtime.generate / tokens generated (prefill of the "
                        "prompt excluded: the session is built first); processor = time inside "
                        "the logits processors (mask + advance) per token; medians over rounds.",
                        "Arms interleaved, order rotated per round; temperature 1, seed = round."]}
    return write_results(args.out, "grammar", result, "leyline-bench grammar", _markdown(result))


def _generate(runtime: Runtime, compiler: GrammarCompiler, plan, tokens: int,
              seed: int, budgeted: bool = False) -> tuple[float, list[float], int]:
    sid = f"bench-grammar-{seed}"
    runtime.create_session(SessionCreate(session_id=sid, messages=PROMPT))
    spent: list[float] = []
    budget = tokens if budgeted else None
    processors = None if plan is None else [_Timed(p, spent) for p in plan.processors(compiler, budget)]
    request = GenerateRequest(max_tokens=tokens, temperature=1.0, seed=seed)
    try:
        t0 = time.perf_counter()
        out = runtime.generate(sid, request, processors=processors)
        elapsed = time.perf_counter() - t0
    finally:
        runtime.delete_session(sid)
    n = out.usage.completion_tokens
    return elapsed / max(n, 1), spent, n


def _compile_times(runtime: Runtime, plans: dict) -> dict[str, dict[str, float]]:
    out = {}
    for arm, plan in plans.items():
        if plan is None or plan.grammar is None:
            continue
        cold = GrammarCompiler(runtime.tokenizer)
        t0 = time.perf_counter()
        cold.processor(plan.grammar)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        cold.processor(plan.grammar)
        cached = time.perf_counter() - t0
        out[arm] = {"cold_ms": first * 1e3, "cached_ms": cached * 1e3}
    return out


def _library() -> dict[str, str]:
    from importlib.metadata import version

    return {"name": "llguidance", "version": version("llguidance")}


def _markdown(result: dict) -> str:
    rows = [[arm, r["step_ms_per_token"], r["processor_us_per_token"], r["processor_share"], r["step_vs_free"],
             r["tokens"]] for arm, r in result["results"].items()]
    compile_rows = [[arm, c["cold_ms"], c["cached_ms"]] for arm, c in result["compile_ms"].items()]
    lib = result["library"]
    return "\n".join([
        f"Constrained decoding with {lib['name']} {lib['version']}.", "",
        md_table(["arm", "ms/token (step)", "µs/token in processors", "processor share", "step vs free",
                  "tokens"], rows), "",
        "Grammar compile (per distinct grammar; later requests copy the cached matcher):", "",
        md_table(["arm", "cold ms", "cached ms"], compile_rows), "",
        *[f"- {n}" for n in result["notes"]]])
