"""``leyline-bench fidelity``: F/R/L/N arms over a workload file, admission by target agreement.

Runs :func:`leyline_bench.fidelity.arms.run_arms_batches` on every case of a
JSONL workload (see ``workload.py``), judges admission (``admission.py``) and
reports per category, per (category, group) and overall: JSD(R‖L), JSD(R‖N),
top-1 agreement, top-10 overlap, tokens to the first greedy divergence of L
from R, and L's target preservation on admitted cases. Non-admitted cases are
reported as diagnostics with the same metrics and the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from leyline_sdk.protocol import Directive, Message

from . import arms as harness
from leyline_runtime.runtime import Runtime, RuntimeConfig
from ..common import plots
from . import policy_bench
from .admission import IMPLICIT_TOKENS, judge
from ..common.machine import runtime_info
from ..common.output import md_table, write_results
from ..common.stats import mean, median, ratio, timed
from .workload import DEFAULT_OUT

DEFAULT_WORKLOAD = DEFAULT_OUT


def add_parser(sub) -> None:
    p = sub.add_parser("fidelity")
    p.add_argument("--workload", default=str(DEFAULT_WORKLOAD), help="workload JSONL (default: the shipped one)")
    p.add_argument("--greedy-tokens", type=int, default=32, help="greedy tokens generated and compared per case")
    p.add_argument("--limit", type=int, default=None, help="first N cases only")
    p.add_argument("--categories", nargs="+", default=None, help="only cases of these categories")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype")
    policy_bench.add_arguments(p)
    p.set_defaults(run=run, quick_overrides={"limit": 2, "greedy_tokens": 4, "models": "default", "sessions": 1,
                                             "edits": 2, "single_cases": 1, "session_tokens": 500})


def load_cases(path: str | Path, categories=None, limit=None) -> list[dict]:
    with open(path) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    if categories:
        cases = [c for c in cases if c["category"] in categories]
    return cases[:limit] if limit else cases


def batches_of(case: dict) -> list[list[Directive]]:
    raw = case["edits"] if "edits" in case else [case["directives"]]
    return [[Directive.model_validate(d) for d in batch] for batch in raw]


def run_case(runtime: Runtime, case: dict, greedy_tokens: int) -> dict:
    history = [Message.model_validate(m) for m in case["history"]]
    seconds, rep = timed(lambda: harness.run_arms_batches(runtime, history, batches_of(case), greedy_tokens))
    tok = runtime.tokenizer
    verdict = judge(tok, rep.f_greedy, rep.r_greedy, rep.l_greedy, case.get("target"), greedy_tokens)
    implicit = judge(tok, rep.f_greedy, rep.r_greedy, rep.l_greedy, None, greedy_tokens)
    return {
        "name": case["name"], "category": case["category"], "group": case.get("group", ""),
        "target": case.get("target"), "implicit_target": verdict.implicit_target,
        "admitted": verdict.admitted, "reason": verdict.reason,
        "f_hits": verdict.f_hits, "r_hits": verdict.r_hits, "l_preserves": verdict.l_hits,
        "implicit_admitted": implicit.admitted, "implicit_l_preserves": implicit.l_hits,
        "jsd_r_l": rep.l_vs_r.jsd, "jsd_r_n": rep.n_vs_r.jsd, "jsd_r_f": rep.f_vs_r.jsd,
        "top1_l": rep.l_vs_r.top1_agree, "top1_n": rep.n_vs_r.top1_agree,
        "top10_l": rep.l_vs_r.top10_overlap, "top10_n": rep.n_vs_r.top10_overlap,
        "greedy_divergence": rep.greedy_divergence, "greedy_tokens": greedy_tokens,
        "deltas": rep.deltas, "expected_delta": case.get("expected_delta"),
        "applied_modes": rep.applied_modes, "seconds": seconds,
        "greedy_ids": {"F": rep.f_greedy, "R": rep.r_greedy, "L": rep.l_greedy},
        "greedy_text": {arm: tok.decode(ids) for arm, ids in
                        (("F", rep.f_greedy), ("R", rep.r_greedy), ("L", rep.l_greedy))},
    }


def aggregate(rows: list[dict]) -> dict:
    def m(key):
        return mean([float(r[key]) for r in rows])

    jl, jn = m("jsd_r_l"), m("jsd_r_n")
    return {
        "cases": len(rows),
        "jsd_r_l_mean": jl, "jsd_r_l_median": median([r["jsd_r_l"] for r in rows]),
        "jsd_r_n_mean": jn, "jsd_r_n_median": median([r["jsd_r_n"] for r in rows]),
        "jsd_n_over_l": ratio(jn, jl),
        "top1_l": m("top1_l"), "top1_n": m("top1_n"), "top10_l": m("top10_l"), "top10_n": m("top10_n"),
        "greedy_divergence_mean": m("greedy_divergence"),
        "greedy_divergence_median": median([r["greedy_divergence"] for r in rows]),
        "l_preservation": m("l_preserves"),
    }


def _natural(key: tuple[str, str]) -> tuple:
    """("position_stress", "δ=128") sorts by category, then by the group's number."""
    digits = "".join(ch for ch in key[1] if ch.isdigit())
    return key[0], int(digits) if digits else 0, key[1]


def summarise(rows: list[dict]) -> dict:
    """Admitted (evidence) and non-admitted (diagnostics), overall and per category / group."""
    def split(subset):
        adm = [r for r in subset if r["admitted"]]
        rest = [r for r in subset if not r["admitted"]]
        reasons: dict[str, int] = {}
        for r in rest:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        return {"admitted": aggregate(adm), "not_admitted": aggregate(rest), "all": aggregate(subset),
                "not_admitted_reasons": reasons}

    implicit = [r for r in rows if r["implicit_admitted"]]
    cats = sorted({r["category"] for r in rows})
    groups = sorted({(r["category"], r["group"]) for r in rows if r["group"]}, key=_natural)
    return {"overall": split(rows),
            "self_agreement": {"admitted": len(implicit),
                               "l_preservation": mean([float(r["implicit_l_preserves"]) for r in implicit])},
            "categories": {c: split([r for r in rows if r["category"] == c]) for c in cats},
            "groups": {f"{c} {g}": split([r for r in rows if (r["category"], r["group"]) == (c, g)])
                       for c, g in groups}}


def run(args, log=print) -> dict:
    cases = load_cases(args.workload, args.categories, args.limit)
    if args.policies:
        return policy_bench.run(args, cases)
    # four live sessions (F, R, L, N) of at most max_position_embeddings tokens each
    runtime = Runtime(RuntimeConfig(model_path=args.model, dtype=args.dtype))
    rows = []
    for c in cases:
        rows.append(run_case(runtime, c, args.greedy_tokens))
        r = rows[-1]
        log(f"fidelity {r['name']}: JSD(R|L) {r['jsd_r_l']:.2e} JSD(R|N) {r['jsd_r_n']:.2e} "
            f"div {r['greedy_divergence']} admitted={r['admitted']} ({r['seconds']:.1f} s)")
    summary = summarise(rows)
    result = {"benchmark": "fidelity", "workload": str(args.workload),
              "settings": {"greedy_tokens": args.greedy_tokens, "limit": args.limit, "categories": args.categories,
                           "model": args.model or "embedded default", "dtype": args.dtype},
              "runtime": runtime_info(runtime),
              "summary": summary, "cases": rows,
              "notes": ["JSD in nats between next-token distributions after the assistant header.",
                        "Admission: F's and R's greedy continuations both hit the target (see admission.py)."]}
    payload = write_results(args.out, "fidelity", result, "leyline-bench fidelity", _markdown(summary, rows))
    _plot(args.out, summary)
    return payload


def _rows_for(summary: dict, which: str) -> list[list]:
    out = []
    for label, block in [("overall", summary["overall"]), *summary["categories"].items(), *summary["groups"].items()]:
        a = block[which]
        out.append([label, a["cases"], a["jsd_r_l_mean"], a["jsd_r_n_mean"], a["jsd_n_over_l"], a["top1_l"],
                    a["top1_n"], a["top10_l"], a["top10_n"], a["greedy_divergence_median"],
                    a["l_preservation"] if which == "admitted" else None])
    return out


def _markdown(summary: dict, rows: list[dict]) -> str:
    headers = ["cases", "n", "JSD(R‖L)", "JSD(R‖N)", "N/L", "top-1 L", "top-1 N", "top-10 L", "top-10 N",
               "divergence (median tokens)", "L keeps target"]
    reasons = summary["overall"]["not_admitted_reasons"]
    selfa = summary["self_agreement"]
    text = "## Admitted cases (evidence)\n\n" + md_table(headers, _rows_for(summary, "admitted"))
    text += "\n\n## Not admitted (diagnostics)\n\n" + md_table(headers, _rows_for(summary, "not_admitted"))
    text += "\n\nReasons: " + (", ".join(f"{k}: {v}" for k, v in reasons.items()) or "none")
    text += (f"\n\nSelf-agreement (target ignored: F's first {IMPLICIT_TOKENS} greedy tokens equal R's): "
             f"{selfa['admitted']} of {len(rows)} cases; L keeps R's tokens in "
             f"{selfa['l_preservation']:.1%} of them.")
    stress = [r for r in rows if r.get("expected_delta") is not None]
    if stress:
        text += "\n\n## Position stress: measured δ\n\n" + md_table(
            ["case", "expected δ", "measured δ", "JSD(R‖L)", "JSD(R‖N)"],
            [[r["name"], r["expected_delta"], ",".join(map(str, r["deltas"])), r["jsd_r_l"], r["jsd_r_n"]]
             for r in stress])
    return text + "\n\n![fidelity](fidelity.png)\n"


def _plot(out, summary) -> None:
    labels = list(summary["categories"]) + list(summary["groups"])
    blocks = list(summary["categories"].values()) + list(summary["groups"].values())
    if not labels:
        return
    series = {"JSD(R‖L) all": [b["all"]["jsd_r_l_mean"] for b in blocks],
              "JSD(R‖N) all": [b["all"]["jsd_r_n_mean"] for b in blocks]}
    series = {k: [v if v else None for v in vs] for k, vs in series.items()}
    plots.grouped_bars(f"{out}/fidelity.png", "next-token JSD vs honest re-prefill (mean, all cases)", labels,
                       series, "JSD (nats, log)", log=True)
