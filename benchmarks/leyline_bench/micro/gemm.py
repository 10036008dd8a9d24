"""``leyline-bench gemm``: the model's fp32 products on torch's BLAS (MKL) vs oneDNN, by row count.

One "set" is one of each product a decoder layer runs (q, kv_a, kv_b, o, gate, up,
down) plus the LM head, with the served model's shapes, through :class:`Linear`
under ``serve --cpu-gemm blas`` and ``onednn``. Libraries alternate per repetition.
Rows: 1 is a lone decode step, 16 a step of 16 sessions, 512+ prefill chunks.
Each library's result is also compared with the fp64 product.
"""

from __future__ import annotations

import time

import torch

from leyline_runtime.model import load_model
from leyline_runtime.model.layers import Linear, cpu_gemm, cpu_gemm_setting, cpu_vendor, set_cpu_gemm
from ..common import plots
from ..common.output import md_table, write_results
from ..common.stats import median, ratio, rotated

LIBRARIES = ("blas", "onednn")


def add_parser(sub) -> None:
    p = sub.add_parser("gemm")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512, 4096],
                   help="row counts (tokens) per product")
    p.add_argument("--reps", type=int, default=5, help="repetitions per measurement")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.set_defaults(run=run, quick_overrides={"rows": [1, 16], "reps": 1})


def products(model) -> dict[str, Linear]:
    """One of each Linear a decoder layer runs, and the LM head."""
    layer = model.model.layers[0]
    found = {name.rsplit(".", 1)[-1]: m for name, m in layer.named_modules() if isinstance(m, Linear)}
    return {**found, "lm_head": model.lm_head}


def _time_set(linears: dict[str, Linear], xs: dict[str, torch.Tensor], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        for name, layer in linears.items():
            layer(xs[name])
    return (time.perf_counter() - start) / calls


def _relative_error(layer: Linear, x: torch.Tensor) -> float:
    """max |product - fp64 product| / max |fp64 product|."""
    exact = x.double() @ layer.weight.double().T
    if layer.bias is not None:
        exact = exact + layer.bias.double()
    return ((layer(x).double() - exact).abs().max() / exact.abs().max()).item()


def _cell(linears, rows: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(rows)
    xs = {name: torch.randn(rows, m.in_features, generator=gen) for name, m in linears.items()}
    calls = max(1, 2048 // rows)  # a timed sample of at least ~2k rows
    samples: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    error: dict[str, float] = {}
    with torch.no_grad():
        for lib in LIBRARIES:  # warm: first calls pay one-time costs (oneDNN builds its kernels)
            set_cpu_gemm(lib)
            _time_set(linears, xs, 1)
            error[lib] = max(_relative_error(m, xs[n]) for n, m in linears.items())
        for r in range(reps):
            for lib in rotated(LIBRARIES, r):
                set_cpu_gemm(lib)
                samples[lib].append(_time_set(linears, xs, calls))
    med = {lib: median(v) for lib, v in samples.items()}
    return {"rows": rows, "median_s": med, "speedup_onednn": ratio(med["blas"], med["onednn"]),
            "gflop_per_s": {lib: 2 * rows * sum(m.in_features * m.out_features for m in linears.values())
                            / s / 1e9 for lib, s in med.items()},
            "max_relative_error": error, "samples_s": samples}


def run(args, log=print) -> dict:
    model = load_model(args.model, dtype=torch.float32)
    linears = products(model)
    chosen, setting = cpu_gemm(), cpu_gemm_setting()
    cells = []
    try:
        for rows in args.rows:
            cells.append(_cell(linears, rows, args.reps))
            c = cells[-1]
            log(f"gemm rows={rows}: blas {c['median_s']['blas'] * 1e3:.3f} ms, onednn "
                f"{c['median_s']['onednn'] * 1e3:.3f} ms per set ({c['speedup_onednn']:.2f}x)")
    finally:
        set_cpu_gemm(setting)
    result = {"benchmark": "gemm", "settings": {"rows": args.rows, "reps": args.reps, "model": args.model},
              "cpu_vendor": cpu_vendor(), "auto_choice": chosen,
              "shapes": {n: [m.in_features, m.out_features] for n, m in linears.items()}, "cells": cells,
              "notes": ["One set = one call of each product in `shapes` (a decoder layer's and the LM head).",
                        "speedup_onednn = blas time / onednn time (> 1: oneDNN is faster).",
                        "max_relative_error: max |product - fp64 product| / max |fp64 product|, over the set.",
                        "Libraries alternate per repetition (order rotated); times are medians."]}
    payload = write_results(args.out, "gemm", result, "leyline-bench gemm", _markdown(result))
    plots.lines(f"{args.out}/gemm.png", "fp32 products per set (median)", [c["rows"] for c in cells],
                {lib: [c["gflop_per_s"][lib] for c in cells] for lib in LIBRARIES}, "rows", "GFLOP/s", logx=True)
    return payload


def _markdown(result) -> str:
    head = (f"CPU vendor {result['cpu_vendor'] or 'unknown'}: `--cpu-gemm auto` runs on "
            f"**{result['auto_choice']}** here.\n\n")
    headers = ["rows", "blas ms", "onednn ms", "onednn speedup", "blas GFLOP/s", "onednn GFLOP/s",
               "blas rel. error", "onednn rel. error"]
    rows = [[c["rows"], c["median_s"]["blas"] * 1e3, c["median_s"]["onednn"] * 1e3, c["speedup_onednn"],
             c["gflop_per_s"]["blas"], c["gflop_per_s"]["onednn"], c["max_relative_error"]["blas"],
             c["max_relative_error"]["onednn"]] for c in result["cells"]]
    return head + md_table(headers, rows) + "\n\n![gemm](gemm.png)\n"
