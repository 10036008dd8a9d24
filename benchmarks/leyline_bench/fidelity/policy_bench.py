"""The policy comparison behind ``leyline-bench fidelity --policies ...``: models × workloads.

Workloads: single-edit cases (from the fidelity workload, one batch each; the next turn is
the assistant-header probe) and agent-like multi-edit sessions (``edit_sessions.py``).
Models: ``stress_models.py``. Writes ``fidelity_policies.{json,md,png}``.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from leyline_sdk.protocol import Directive, Message

from leyline_runtime.model.default import default_tokenizer_path
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..common import plots
from . import stress_models
from .edit_sessions import EditSession, Step, build_session
from ..common.machine import runtime_info
from ..common.output import fmt, md_table, write_results
from .policies import DECISIVE, auto_config, check_policies, run_session
from ..common.stats import median, percentile, ratio

NAME = "fidelity_policies"
TARGET = {"next_jsd_p90": 1e-3, "next_top1": 0.99, "share": 0.20}


def add_arguments(p) -> None:
    p.add_argument("--policies", default=None,
                   help="compare edit policies instead of the F/R/L/N arms: comma-separated amortize, forget, "
                        "auto, forget-every-N (writes fidelity_policies.*)")
    p.add_argument("--models", default=",".join(stress_models.VARIANTS),
                   help="with --policies: model variants (default: %(default)s)")
    p.add_argument("--sessions", type=int, default=2, help="with --policies: multi-edit sessions per model")
    p.add_argument("--session-seed", type=int, default=0,
                   help="with --policies: seed of the first multi-edit session (the others follow it), so "
                        "thresholds calibrated on one seed range can be reported on another")
    p.add_argument("--edits", type=int, default=20, help="with --policies: edits per multi-edit session")
    p.add_argument("--session-tokens", type=int, default=1200,
                   help="with --policies: a multi-edit session's starting history, in tokens")
    p.add_argument("--single-cases", type=int, default=5, help="with --policies: single-edit cases per model")
    p.add_argument("--no-suffix", action="store_true", help="with --policies: skip the whole-suffix scoring")
    p.add_argument("--jobs", type=int, default=1,
                   help="with --policies: models measured in parallel worker processes (each single-threaded)")
    p.add_argument("--auto-forget-threshold", type=float, default=None,
                   help="with --policies: auto forgets an edit whose drift (layer-1 change x (layers - 1)) "
                        "passes this (default: the runtime's)")
    p.add_argument("--auto-repair-threshold", type=float, default=None,
                   help="with --policies: auto repairs the tail when drift x attention passes this "
                        "(negative: never; default: the runtime's, never)")
    p.add_argument("--auto-repair-tail", type=int, default=None,
                   help="with --policies: rows auto's tail repair recomputes (default: the runtime's)")
    p.add_argument("--drift-budget", type=float, default=None, help="auto's budget (negative: none)")


def single_edit_sessions(cases: list[dict], k: int) -> list[EditSession]:
    """``k`` single-batch cases, round-robin over categories (multi-edit cases left out)."""
    by_cat: dict[str, list[dict]] = {}
    for c in cases:
        if "directives" in c:
            by_cat.setdefault(c["category"], []).append(c)
    picked: list[dict] = []
    while len(picked) < k and any(by_cat.values()):
        for cat in sorted(by_cat):
            if by_cat[cat] and len(picked) < k:
                picked.append(by_cat[cat].pop(0))
    return [EditSession(c["name"], [Message.model_validate(m) for m in c["history"]],
                        [Step(c["category"], [Directive.model_validate(d) for d in c["directives"]], [])])
            for c in picked]


def multi_edit_sessions(tok: ChatTokenizer, args) -> list[EditSession]:
    """``--sessions`` agent-like sessions, seeds ``--session-seed`` on."""
    return [build_session(tok, seed, edits=args.edits, start_tokens=args.session_tokens)
            for seed in range(args.session_seed, args.session_seed + args.sessions)]


def run(args, cases: list[dict]) -> dict:
    policies = check_policies([p.strip() for p in args.policies.split(",") if p.strip()])
    tok = ChatTokenizer.from_file(default_tokenizer_path())
    auto = auto_config(args)
    multi = multi_edit_sessions(tok, args)
    single = single_edit_sessions(cases, args.single_cases)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    jobs = [(name, policies, auto, single, multi, not args.no_suffix, torch.get_num_threads()) for name in names]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            done = list(pool.map(_run_model, jobs))
    else:
        done = [_run_model(job) for job in jobs]
    results = {name: r for name, (r, _, _) in zip(names, done)}
    infos = {name: info for name, (_, info, _) in zip(names, done)}
    verdict = targets(results)
    result = {"benchmark": NAME, "settings": {
        "policies": policies, "models": list(results), "sessions": args.sessions,
        "session_seeds": list(range(args.session_seed, args.session_seed + args.sessions)), "edits": args.edits,
        "session_tokens": args.session_tokens,
        "single_cases": args.single_cases, "jobs": args.jobs, "whole_suffix": not args.no_suffix, "auto": vars(auto)},
        "runtimes": infos, "targets": verdict, "results": results,
        "notes": ["R is the forget session (prefix kept, the rest prefilled); forget_vs_fresh checks it against a "
                  "fresh prefill of the final history.",
                  "share: rows recomputed by directives and repairs / forget's; share_with_signal adds auto's "
                  "signal (one layer per measured position = signal_tokens / num_layers token equivalents).",
                  "next turn: every position of the tool round appended after each edit, plus the assistant "
                  "header after it (probe); JSD in nats against R."]}
    body = _markdown(results, verdict)  # reads the per-session records, which the JSON keeps apart
    samples = {model: {label: r[label].pop("sessions") for label in ("single", "multi")} for model, r in results.items()}
    payload = write_results(args.out, NAME, result, "leyline-bench fidelity --policies", body, samples=samples)
    _plot(args.out, results)
    return payload


def _run_model(job) -> tuple[dict, dict, list[str]]:
    """One model variant over both workloads (a worker process with ``--jobs``)."""
    name, policies, auto, single, multi, whole_suffix, threads = job
    torch.set_num_threads(threads)
    tok = ChatTokenizer.from_file(default_tokenizer_path())
    model = stress_models.build(name, tok.vocab_size)
    rt = Runtime(RuntimeConfig(max_cache_tokens=32768, auto=auto), model=model, tokenizer=tok)
    out, lines = {}, []
    for label, sessions in (("single", single), ("multi", multi)):
        records = []
        for s in sessions:
            t0 = time.perf_counter()
            records.append(run_session(rt, s, policies, whole_suffix=whole_suffix))
            lines.append(f"{NAME} {name} {label} {s.name}: {_line(records[-1])} ({time.perf_counter() - t0:.1f} s)")
            print(lines[-1], flush=True)
        out[label] = {"summary": summarise(records, policies, model.config.num_hidden_layers), "sessions": records}
    out["model"] = {"layers": model.config.num_hidden_layers, "type": model.config.model_type,
                    "moe": any(model.config.is_moe_layer(i) for i in range(model.config.num_hidden_layers))}
    return out, runtime_info(rt), lines


def _line(rec: dict) -> str:
    forget = rec["arms"]["forget"]["recomputed"] or 1
    parts = []
    for p, a in rec["arms"].items():
        parts.append(f"{p}: share {a['recomputed'] / forget:.3f} probe p90 {fmt(percentile(a['probe_jsd'], 90))} "
                     f"turn p90 {fmt(percentile(a['next_jsd'], 90))} top-1 {fmt(_mean(a['next_top1']))}")
    return "; ".join(parts)


def summarise(records: list[dict], policies: list[str], num_layers: int) -> dict:
    forget = sum(r["arms"]["forget"]["recomputed"] for r in records)
    out = {}
    for p in policies:
        arms = [r["arms"][p] for r in records]

        def cat(key):
            return [v for a in arms for v in a[key]]

        recomputed = sum(a["recomputed"] for a in arms)
        signal = sum(a["signal_tokens"] for a in arms) / num_layers
        choices: dict[str, int] = {}
        for a in arms:
            for k, v in a["choices"].items():
                choices[k] = choices.get(k, 0) + v
        out[p] = {
            "recomputed": recomputed, "signal_token_equivalents": signal,
            "share": ratio(recomputed, forget), "share_with_signal": ratio(recomputed + signal, forget),
            "next_jsd_median": median(cat("next_jsd")), "next_jsd_p90": percentile(cat("next_jsd"), 90),
            "next_jsd_max": max(cat("next_jsd"), default=None), "next_top1": _mean(cat("next_top1")),
            "next_top1_decisive": _mean([t for r in records for t, d in zip(r["arms"][p]["next_top1"],
                                                                             r["next_decisive"]) if d]),
            "next_decisive_share": _mean([d for r in records for d in r["next_decisive"]]),
            "next_positions": len(cat("next_jsd")),
            "probe_jsd_median": median(cat("probe_jsd")), "probe_jsd_p90": percentile(cat("probe_jsd"), 90),
            "probe_top1": _mean(cat("probe_top1")), "probes": len(cat("probe_jsd")),
            "suffix_jsd_median": median(cat("suffix_jsd")), "suffix_jsd_p90": percentile(cat("suffix_jsd"), 90),
            "suffix_top1": _mean(cat("suffix_top1")), "choices": choices,
            "signal_median": median(cat("signals")), "attention_median": median(cat("attention")),
        }
    out["forget_vs_fresh_max_jsd"] = max((r["forget_vs_fresh"]["max_jsd"] for r in records), default=None)
    return out


def _mean(values) -> float | None:
    return sum(map(float, values)) / len(values) if values else None


def targets(results: dict) -> dict:
    """auto on multi-edit sessions against the targets (JSD p90 ≤ 1e-3, top-1 ≥ 0.99, ≤ 20% of forget's
    recompute), scored two ways: on the assistant-header probe after each edit (one per edit) and on
    every position of the next turn; and against the forget-every-N family at auto's cost."""
    out = {}
    for model, r in results.items():
        s = r["multi"]["summary"]
        if "auto" not in s:
            continue
        a = s["auto"]
        cheap = a["share_with_signal"] <= TARGET["share"]
        row = {"layers": r.get("model", {}).get("layers"), "share": a["share_with_signal"],
               "probe_jsd_p90": a["probe_jsd_p90"], "probe_top1": a["probe_top1"],
               "next_jsd_p90": a["next_jsd_p90"], "next_top1": a["next_top1"],
               "next_top1_decisive": a["next_top1_decisive"],
               "met_probe": cheap and a["probe_jsd_p90"] <= TARGET["next_jsd_p90"] and a["probe_top1"] >= TARGET["next_top1"],
               "met_turn": cheap and a["next_jsd_p90"] <= TARGET["next_jsd_p90"] and a["next_top1"] >= TARGET["next_top1"]}
        for p, b in s.items():
            if p.startswith("forget-every-"):  # cheaper and no worse on either drift measure
                row[f"dominates {p}"] = (a["share_with_signal"] <= b["share"] and a["probe_jsd_p90"] <= b["probe_jsd_p90"]
                                         and a["next_jsd_p90"] <= b["next_jsd_p90"])
        row.update(equal_cost(s, a["share_with_signal"]))
        row["beats_forget_every_n"] = (row["family_jsd_p90"] is not None and a["next_jsd_p90"] <= row["family_jsd_p90"]
                                       and a["next_top1"] >= row["family_top1"])
        out[model] = row
    return out


JSD_FLOOR = 1e-9  # forget's JSD is rounding noise; log interpolation needs a floor


def equal_cost(summary: dict, share: float) -> dict:
    """The forget-every-N family (amortize = N → ∞, forget = N = 1, and every forget-every-N run)
    at recompute share ``share``: next-turn JSD p90 interpolated log-log and top-1 interpolated
    in log cost between the two family members whose costs bracket ``share``."""
    family = sorted((b["share"], max(b["next_jsd_p90"], JSD_FLOOR), b["next_top1"], p) for p, b in summary.items()
                    if isinstance(b, dict) and (p in ("amortize", "forget") or p.startswith("forget-every-")))
    below = [f for f in family if f[0] <= share]
    above = [f for f in family if f[0] >= share]
    if not below or not above:
        return {"family_jsd_p90": None, "family_top1": None, "family_between": None}
    (x0, j0, t0, p0), (x1, j1, t1, p1) = below[-1], above[0]
    w = 0.0 if x1 == x0 else (math.log(share) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return {"family_jsd_p90": math.exp((1 - w) * math.log(j0) + w * math.log(j1)),
            "family_top1": (1 - w) * t0 + w * t1, "family_between": f"{p0} – {p1}"}


HEADERS = ["policy", "recompute share", "+ signal", "next JSD median", "next JSD p90", "next top-1",
           "next top-1 (decisive)", "probe JSD p90", "probe top-1", "suffix JSD median", "suffix JSD p90", "suffix top-1", "auto choices"]


def _rows(summary: dict) -> list[list]:
    rows = []
    for p, a in summary.items():
        if not isinstance(a, dict):
            continue
        choices = ", ".join(f"{k} {v}" for k, v in sorted(a["choices"].items())) or None
        rows.append([p, a["share"], a["share_with_signal"], a["next_jsd_median"], a["next_jsd_p90"], a["next_top1"],
                     a["next_top1_decisive"], a["probe_jsd_p90"], a["probe_top1"], a["suffix_jsd_median"], a["suffix_jsd_p90"],
                     a["suffix_top1"], choices])
    return rows


def _markdown(results: dict, verdict: dict) -> str:
    text = ("Per model: recomputed rows as a share of forget's (+ signal: auto's layer-0 signal as token "
            "equivalents), next-turn JSD(R‖·) over every position of the turn appended after each edit "
            "(single-edit cases: the assistant-header probe only), whole-suffix JSD over every position from "
            "the first edit on after the last edit. *next top-1 (decisive)*: top-1 agreement at the next-turn "
            f"positions where R's top-1 probability leads its second by at least {DECISIVE} (the target counts "
            "every position; near-ties flip under the smallest drift).\n\n## Targets (multi-edit sessions, auto)\n\n")
    cols = sorted({k for row in verdict.values() for k in row if k.startswith("dominates")},
                  key=lambda c: int(c.rsplit("-", 1)[1]))
    text += md_table(["model", "layers", "share (≤ 0.2)", "probe JSD p90", "probe top-1", "met (probes)",
                      "turn JSD p90", "turn top-1", "met (turn positions)", "turn top-1 (decisive; not a target)"],
                     [[m, v["layers"], v["share"], v["probe_jsd_p90"], v["probe_top1"], v["met_probe"],
                       v["next_jsd_p90"], v["next_top1"], v["met_turn"], v["next_top1_decisive"]]
                      for m, v in verdict.items()])
    text += ("\n\nAgainst forget-every-N at auto's cost: the family (amortize, every forget-every-N run, forget) "
             "interpolated at auto's share between the two members that bracket it (JSD log-log, top-1 in log "
             "cost); *dominates forget-every-N*: auto is no dearer and drifts no more (probe and turn p90).\n\n")
    text += md_table(["model", "auto turn JSD p90", "family at auto's cost", "auto top-1", "family top-1",
                      "between", "auto better at equal cost", *cols],
                     [[m, v["next_jsd_p90"], v["family_jsd_p90"], v["next_top1"], v["family_top1"],
                       v["family_between"], v["beats_forget_every_n"], *[v.get(c) for c in cols]]
                      for m, v in verdict.items()])
    for model, r in results.items():
        for label in ("multi", "single"):
            block = r[label]
            n = len(block["sessions"])
            if n == 0:
                continue
            names = ", ".join(s["name"] for s in block["sessions"])
            what = (f"{n} agent-like sessions × {block['sessions'][0]['edits']} edits ({names})" if label == "multi"
                    else f"{n} single-edit cases")
            info = r.get("model", {})
            text += (f"\n\n## {model} ({info.get('type')}, {info.get('layers')} layers): {what}\n\n"
                     + md_table(HEADERS, _rows(block["summary"])))
            text += (f"\n\nforget vs a fresh prefill of the final history: max JSD "
                     f"{fmt(block['summary']['forget_vs_fresh_max_jsd'])}.")
    return text + "\n\n![cost/quality frontier](fidelity_policies.png)\n"


def _plot(out, results: dict) -> None:
    curves = {}
    for model, r in results.items():
        points = []
        for p, a in r["multi"]["summary"].items():
            if isinstance(a, dict):
                points.append((p, a["share_with_signal"] or 0.0, a["next_jsd_p90"] or 0.0))
        curves[model] = points
    if curves:
        plots.policy_frontier(f"{out}/{NAME}.png", "multi-edit sessions: cost vs next-turn drift", curves,
                              "recompute as a share of forget's (log)", "next-turn JSD(R‖·) p90 (nats, log)")
