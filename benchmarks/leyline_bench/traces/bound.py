"""``leyline-bench traces-bound``: what the best splicing engine could save over a prefix cache, by arithmetic.

``leyline-bench traces`` measures engines, at the context budgets a 2-core CPU can replay. This
command asks how far any engine could go on the same sessions at longer budgets, with no server:
per policy and budget, over the held-out sessions replayed as ``traces`` replays them
(:mod:`.turns`, :mod:`.policies`, the policies' sizes scaled to the budget), it counts

* the **prefix-cache** tokens: what an engine that reuses only a block-aligned common prefix
  computes (:func:`.floor.prefix_cache_computed`: vLLM's prefix caching with ``--block-size B``);
* the **floor** (:mod:`.floor`): what an engine that reuses every row wherever it moved computes
  at best — Leyline's amortize measured at 1.01× of it in ``traces``.

``prefix cache ÷ floor`` is then the most any splicing engine (Leyline, llama.cpp's cache reuse)
can save over a prefix cache on that traffic: a ceiling on the ``traces`` ratio, not a measurement
of an engine. ``traces`` runs print the same prefix-cache count beside the measured plain-vLLM one.

    .venv-vllm/bin/python -m leyline_bench.cli traces-bound --out docs/perf/traces \
        --sessions 60 --caps 8192,16384,32768,65536
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..common.output import fmt, md_table, write_results
from .floor import prefix_cache_computed, stream_floors
from .arms import VLLM_BLOCK_SIZE
from .models import MODELS
from .policies import POLICIES, make_policy, parameters
from ..common.arguments import comma_list
from .turns import raw_calls, replay_policy

NAME = "traces_bound"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME.replace("_", "-"))
    p.add_argument("--model", choices=MODELS, default="qwen2.5-coder-0.5b",
                   help="whose tokens: its chat template and tokenizer render every call (no server starts)")
    p.add_argument("--policies", type=comma_list(POLICIES), default=list(POLICIES),
                   help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--sessions", type=int, default=60, help="the first N held-out sessions (file order)")
    p.add_argument("--caps", type=lambda t: [int(c) for c in t.split(",")], default=[8192, 16384, 32768, 65536],
                   help="comma list of context budgets (tokens); the policies' sizes scale with each")
    p.add_argument("--block-size", type=int, default=VLLM_BLOCK_SIZE,
                   help="the prefix cache's block (vLLM --block-size)")
    p.set_defaults(run=run, quick_overrides={"model": "runtime",
                                             "policies": ["langchain_clear", "ten_line_truncation"],
                                             "sessions": 2, "caps": [4096, 8192]})


def run(args) -> dict:
    from leyline_bench.sessions.load import load_sessions

    from ..common.machine import command_line
    from .models import load_model

    sessions = load_sessions("heldout")[:args.sessions]
    model = load_model(args.model, Path(tempfile.mkdtemp(prefix="leyline-bench-bound-")), max(args.caps), [])
    rows, parameters_run = [], {}
    for cap in args.caps:
        raw = {s.instance_id: raw_calls(s.messages, lambda h: len(model.ids(h)), cap) for s in sessions}
        for name in args.policies:
            policy = make_policy(name, cap)
            parameters_run[f"{name} @ {cap}"] = parameters(policy)
            replays = [replay_policy(sid, calls, policy) for sid, calls in raw.items()]
            ids = [[model.ids(h) for h in r.sent] for r in replays]
            rows.append(_row(name, cap, replays, ids, args.block_size))
            print(f"traces-bound: {name} @ {cap}: prefix cache / floor {fmt(rows[-1]['prefix_over_floor'])}",
                  flush=True)
    result = {"benchmark": NAME, "run_command": command_line(), "model": model.label,
              "model_description": model.description, "block_size": args.block_size,
              "sessions": [s.instance_id for s in sessions], "rows": rows, "policies": parameters_run}
    payload = write_results(args.out, NAME, result, "leyline-bench traces-bound", markdown(result))
    plot(Path(args.out), result)
    return payload


def _row(policy: str, cap: int, replays, ids: list[list[list[int]]], block: int) -> dict:
    floors = stream_floors(ids)
    prefix = prefix_cache_computed(ids, block)
    edited = [(r, t) for r in replays for t in r.edited_turns]
    by_session = {r.instance_id: i for i, r in enumerate(replays)}
    floor_edited = sum(floors[by_session[r.instance_id]][t] for r, t in edited)
    prefix_edited = sum(prefix[by_session[r.instance_id]][t] for r, t in edited)
    floor, computed = sum(map(sum, floors)), sum(map(sum, prefix))
    return {"policy": policy, "cap": cap, "calls": sum(len(s) for s in ids), "edited_calls": len(edited),
            "sessions_edited": sum(bool(r.edited_turns) for r in replays),
            "prompt": sum(len(h) for s in ids for h in s), "prefix_cache": computed, "floor": floor,
            "prefix_over_floor": computed / floor if floor else None,
            "prefix_edited": prefix_edited, "floor_edited": floor_edited,
            "prefix_over_floor_edited": prefix_edited / floor_edited if floor_edited else None}


def markdown(result: dict) -> str:
    rows = [[r["policy"], r["cap"], f"{r['calls']} ({r['edited_calls']})", r["sessions_edited"], r["prompt"],
             r["prefix_cache"], r["floor"], r["prefix_over_floor"], r["prefix_over_floor_edited"]]
            for r in result["rows"]]
    return "\n".join([
        f"Computed by `{result['run_command']}`: no server, arithmetic on token ids. "
        f"{len(result['sessions'])} held-out mini-swe-agent sessions replayed as `leyline-bench traces` replays "
        f"them, in `{result['model']}`'s tokens ({result['model_description']}). *prefix cache*: prompt tokens an "
        f"engine computes that reuses the longest {result['block_size']}-token-block-aligned prefix shared with "
        f"the previous request (vLLM's prefix caching); *floor*: the tokens of each call not present, in order, in "
        f"the previous call (the best any engine that reuses moved rows can do; `traces/floor.py`). "
        f"*prefix cache ÷ floor* bounds what Leyline, or llama.cpp's cache reuse, can save over a prefix cache.",
        "", md_table(["policy", "budget (tokens)", "calls (edited)", "sessions edited", "prompt tokens sent",
                      "prefix cache", "floor", "prefix cache ÷ floor", "edited calls: prefix cache ÷ floor"], rows),
        "", "## Policies (parameters at each budget)", "",
        *[f"* `{k}`: " + ", ".join(f"{p} = {v}" for p, v in params.items())
          for k, params in result["policies"].items()]])


def plot(out: Path, result: dict) -> None:
    from ..common.plots import lines

    caps = sorted({r["cap"] for r in result["rows"]})
    series = {p: [next((r["prefix_over_floor"] for r in result["rows"] if r["policy"] == p and r["cap"] == c), None)
                  for c in caps] for p in dict.fromkeys(r["policy"] for r in result["rows"])}
    lines(out / f"{NAME}.png", f"prefix cache ÷ floor, {len(result['sessions'])} sessions, {result['model']}",
          caps, series, "context budget (tokens)", "prefix cache ÷ floor")
