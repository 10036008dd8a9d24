"""``leyline-bench drift-agent``: what the agent does next after a real edit, under every mode.

A sibling of ``drift-real`` rather than a flag of it: ``drift-real`` scores the session's own next turn
token by token and a fixed number of greedy tokens; this one generates the next assistant turn to the end
of its action and compares the action (:mod:`.agent_action`) — the agent's own yardstick — with the
exact prefill's, and scores the exact prefill's turn teacher-forced (KL, and the margin over the turn the
unedited history generates; :mod:`.agent_case`). The two share the edits (:mod:`.real_edits`), the
modes' rows (:mod:`.real_modes`, on the model's transformers implementation) and the journal.

The modes: amortize, the corrections of its rows (``repair-W``, ``dependent-N``, ``tail-K``), ``auto``
and ``forget``, each against ``exact``; the floor is ``chunked-C``, a second exact prefill in C-token
chunks (on a CPU a second one-shot prefill repeats the first bit for bit and would say nothing).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from leyline_runtime.auto_rule import AutoConfig
from ..common.output import write_results
from ..sessions.load import load_sessions
from .agent_case import measure_edit
from .agent_report import markdown, plot, summarise
from .drift_oracle import rope_slot
from .drift_real import _models, _shape, load
from .journal import Journal, each_edit
from .real_case import history_rows
from .real_edits import Renderer, add_edit_selection, select_edits

NAME = "drift_agent"
MODES = "amortize,repair-128,dependent-1,dependent-2,tail-128,auto,forget,chunked-512"


def add_parser(sub) -> None:
    p = sub.add_parser("drift-agent")
    add_edit_selection(p)
    p.add_argument("--modes", default=MODES,
                   help="modes against exact: amortize, repair-W, dependent-N, tail-K, auto, forget, chunked-C "
                        "(the floor: the last chunked-C given)")
    p.add_argument("--action-tokens", type=int, default=192, help="most tokens generated for the next turn")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="the run's dtype")
    p.add_argument("--drift-budget", type=float, default=None, help="auto's drift budget (default: the runtime's)")
    p.add_argument("--journal", default=None,
                   help="JSON-lines file of finished edits: read on start and appended after each edit, so a run "
                        "cut short resumes where it stopped")
    p.add_argument("--name", default=NAME, help=f"output files' name (default {NAME}: <out>/{NAME}.json, .md, .png)")
    p.set_defaults(run=run, quick_overrides={
        "models": "tiny-qwen2=random-qwen2", "sessions": 12, "edits": 4, "max_tokens": 3500,
        "modes": "amortize,dependent-1,tail-16,auto,forget,chunked-256", "action_tokens": 8, "dtype": "float32"})


def run(args, log=print) -> dict:
    cfg = AutoConfig() if args.drift_budget is None else replace(AutoConfig(), drift_budget=args.drift_budget)
    modes = [m for m in args.modes.split(",") if m]
    floor = next((m for m in reversed(modes) if m.startswith("chunked-")), None)
    kinds = [k for k in args.kinds.split(",") if k]
    sessions = load_sessions(args.split)[:args.sessions]
    models = {}
    samples = {}
    for label, spec in _models(args.models):
        model, tok = load(spec, getattr(torch, args.dtype))
        render = Renderer(tok)
        edits = select_edits(render, sessions, kinds, args.edits, args.max_tokens, args.turn_tokens)
        journal = Journal(args.journal, f"{label}/agent") if args.journal else None
        records = play(model, render, edits, cfg, modes, args, journal, log=lambda s, at=label: log(f"{at} {s}"))
        models[label] = {"spec": spec, "dtype": args.dtype, **_shape(model), "floor": floor,
                         "seconds": sum(r["seconds"] for r in records), "summary": summarise(records, modes)}
        samples[label] = records
        del model
    settings = {k: v for k, v in vars(args).items() if k not in ("run", "quick_overrides")} | {"auto": cfg.__dict__}
    result = {"benchmark": args.name, "settings": settings, "models": models}
    payload = write_results(args.out, args.name, result, "leyline-bench drift-agent", markdown(models, args, floor),
                            samples=samples)
    plot(f"{args.out}/{args.name}.png", models, floor)
    return payload


def play(model, render: Renderer, edits, cfg, modes: list[str], args, journal: Journal | None, log=print) -> list[dict]:
    """Every edit under every mode; the unedited history's rows are prefilled once per history."""
    slot, cached = rope_slot(model), {}

    def measure(edit):
        key = (edit.history.session, edit.history.first_round)
        if key not in cached:
            cached.clear()
            cached[key] = history_rows(model, edit.history.tokens)
        return measure_edit(model, render, edit, cached[key], slot, cfg, modes, args.action_tokens)

    def describe(n, edit, record):
        ms = record["modes"]
        return (f"tail {record['tail']} turn {record['turn_tokens']} ({record['seconds']:.0f} s) same action: "
                + " ".join(f"{m} {'y' if r['same_action'] else 'n'}" for m, r in ms.items() if m != "exact")
                + (f"; KL amortize {ms['amortize']['kl']:.3g}" if "amortize" in ms else ""))
    return each_edit(edits, measure, journal, describe, log)
