"""``leyline-bench prefill``: prompt prefill, Leyline's paged engine vs transformers on the same weights.

Per dtype × context: a fresh prompt of random token ids, prefilled by

* ``leyline`` — ``Engine.prefill`` into fresh cache blocks (the path every
  session append, rebuild and ``forget`` re-prefill takes), last-token logits;
* ``peer`` — transformers ``DeepseekV3ForCausalLM`` with a fresh ``DynamicCache``,
  ``logits_to_keep=1``.

Arms alternate per repetition (order rotated), so both see the same machine
load. Each cell also gives both arms' useful GFLOP/s against this machine's
ceilings in the same dtype (:mod:`.roofline`): how much room is left at all. Contexts beyond the model's ``max_position_embeddings`` are timed with
that limit raised (``--max-positions``) on both sides: RoPE needs no table.
"""

from __future__ import annotations

import gc

import torch

from leyline_runtime.inspection import Inspector
from leyline_runtime.model import load_model
from leyline_runtime.model.layers import CPU_GEMMS, set_cpu_gemm
from leyline_runtime.runtime import Runtime, RuntimeConfig
from ..common import plots
from ..common.machine import runtime_info
from ..common.output import md_table, write_results
from .peer import TransformersPeer, checkpoint_folder, scratch_dir
from .roofline import bound_seconds, gemm_ceiling, prefill_flops, sdpa_ceiling
from ..common.stats import median, ratio, rotated, timed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GEMM_SIZE = 2048  # the GEMM ceiling: one 2048-cubed product
ARMS = ("leyline", "peer")


def add_parser(sub) -> None:
    p = sub.add_parser("prefill")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096, 8192, 16384],
                   help="context lengths in tokens")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES),
                   help="model dtypes to measure")
    p.add_argument("--reps", type=int, default=3, help="repetitions per measurement")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="raise max_position_embeddings to this for the timing (default: max of --contexts)")
    p.add_argument("--cpu-gemm", choices=list(CPU_GEMMS), default="auto",
                   help="Leyline's library for fp32 CPU products (serve --cpu-gemm; default: %(default)s)")
    p.set_defaults(run=run, quick_overrides={"contexts": [256], "dtypes": ["float32"], "reps": 1})


class PrefillArms:
    def __init__(self, args, dtype: str, max_positions: int, scratch: str):
        model = load_model(args.model, dtype=DTYPES[dtype])
        model.config.max_position_embeddings = max(max_positions, model.config.max_position_embeddings)
        self.runtime = Runtime(RuntimeConfig(model_path=args.model, dtype=dtype,
                                             max_cache_tokens=max(args.contexts) + 64), model=model)
        folder = checkpoint_folder(args.model, model, scratch)
        self.peer = TransformersPeer(folder, DTYPES[dtype], max_position_embeddings=model.config.max_position_embeddings)

    def measure(self, arm: str, ids: list[int]) -> float:
        gc.collect()
        if arm == "peer":
            return timed(lambda: self.peer.prefill(ids))[0]
        with Inspector(self.runtime).scratch_prefill(ids) as prefill:
            return timed(prefill)[0]


def _cells(arms: PrefillArms, dtype: str, args, log, gemm_gflops: float) -> list[dict]:
    cfg = arms.runtime.model.config
    vocab = cfg.vocab_size
    cells = []
    warm = [int(t) for t in torch.randint(0, vocab, (64,))]
    for arm in ARMS:  # first calls pay one-time costs
        arms.measure(arm, warm)
    for n in args.contexts:
        ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(args.reps):
            for arm in rotated(ARMS, r):
                samples[arm].append(arms.measure(arm, ids))
        med = {arm: median(v) for arm, v in samples.items()}
        flops = prefill_flops(cfg, n)
        ceilings = {"gemm_gflops": gemm_gflops, "causal_sdpa_gflops": sdpa_ceiling(cfg, DTYPES[dtype], n)}
        bound = bound_seconds(flops, ceilings)
        cell = {"dtype": dtype, "context": n, "median_s": med,
                "tokens_per_s": {arm: n / s for arm, s in med.items()},
                "gflops_per_s": {arm: flops["total"] / s / 1e9 for arm, s in med.items()}, "flops": flops,
                "ceilings": ceilings, "bound_s": bound, "share_of_bound": {arm: bound / s for arm, s in med.items()},
                "speedup_vs_peer": ratio(med["peer"], med["leyline"]), "samples_s": samples}
        cells.append(cell)
        log(f"prefill {dtype} ctx={n}: leyline {cell['tokens_per_s']['leyline']:.0f} tok/s, "
            f"transformers {cell['tokens_per_s']['peer']:.0f} tok/s ({cell['speedup_vs_peer']:.2f}x)")
    return cells


def run(args, log=print) -> dict:
    set_cpu_gemm(args.cpu_gemm)
    max_positions = args.max_positions or max(args.contexts)
    cells, info, gemm = [], None, {}
    with scratch_dir() as scratch:
        for dtype in args.dtypes:
            arms = PrefillArms(args, dtype, max_positions, scratch)
            info = runtime_info(arms.runtime)
            gemm[dtype] = gemm_ceiling(DTYPES[dtype], GEMM_SIZE)
            log(f"prefill {dtype}: a {GEMM_SIZE}-cubed GEMM runs at {gemm[dtype]:.0f} GFLOP/s here")
            cells += _cells(arms, dtype, args, log, gemm[dtype])
            del arms
    if info is not None:
        info["dtype"] = " and ".join(args.dtypes)  # each cell names its own
    keys = ("contexts", "dtypes", "reps", "model", "cpu_gemm")
    result = {"benchmark": "prefill", "settings": {**{k: getattr(args, k) for k in keys},
                                                   "max_positions": max_positions},
              "runtime": info, "gemm_ceiling_gflops": gemm, "cells": cells,
              "notes": ["Arms interleaved per repetition (order rotated); times are medians in seconds.",
                        "peer: transformers DeepseekV3ForCausalLM (sdpa attention), same weights, fresh DynamicCache.",
                        "speedup = peer time / leyline time (> 1: Leyline is faster).",
                        "GFLOP/s: the prefill's useful FLOPs (products, causal attention, one LM-head row) / "
                        "median time. Ceilings, in the same dtype and threads: one GEMM per dtype, and one layer's causal "
                        "SDPA at each context with the model's head sizes.",
                        "share of bound: (products and LM head at the GEMM ceiling + attention at the SDPA ceiling) / median "
                        "time; 1 would mean running at the ceilings throughout."]}
    payload = write_results(args.out, "prefill", result, "leyline-bench prefill", _markdown(cells, gemm))
    _plot(args.out, cells)
    return payload


def _markdown(cells, gemm) -> str:
    headers = ["dtype", "context", "leyline tok/s", "transformers tok/s", "leyline ms", "transformers ms", "speedup",
               "leyline GFLOP/s", "transformers GFLOP/s", "attention share of FLOPs", "causal SDPA GFLOP/s",
               "leyline share of bound", "transformers share of bound"]
    rows = [[c["dtype"], c["context"], c["tokens_per_s"]["leyline"], c["tokens_per_s"]["peer"],
             c["median_s"]["leyline"] * 1000, c["median_s"]["peer"] * 1000, c["speedup_vs_peer"],
             c["gflops_per_s"]["leyline"], c["gflops_per_s"]["peer"], c["flops"]["attention"] / c["flops"]["total"],
             c["ceilings"]["causal_sdpa_gflops"], c["share_of_bound"]["leyline"], c["share_of_bound"]["peer"]]
            for c in cells]
    lines = [f"This machine, {dtype}: a {GEMM_SIZE}-cubed GEMM runs at {rate:.0f} GFLOP/s." for dtype, rate in gemm.items()]
    return md_table(headers, rows) + "\n\n" + "\n".join(lines) + "\n\n![prefill throughput](prefill.png)\n"


def _plot(out, cells) -> None:
    if not cells:
        return
    contexts = sorted({c["context"] for c in cells})
    series = {}
    for dtype in sorted({c["dtype"] for c in cells}):
        for arm, name in (("leyline", "leyline"), ("peer", "transformers")):
            by_ctx = {c["context"]: c["tokens_per_s"][arm] for c in cells if c["dtype"] == dtype}
            series[f"{name} {dtype}"] = [by_ctx.get(n) for n in contexts]
    plots.lines(f"{out}/prefill.png", "prefill throughput (median)", contexts, series, "context (tokens)",
                "tokens / s", logx=True)
