"""``leyline-bench edit``: the latency of one history edit, Leyline vs re-prefill vs transformers.

For each context × edit position × span: one cached session of the original
history; then, interleaved per repetition (order rotated), the arms

* ``amortize`` / ``forget`` — ``Runtime.apply`` on a fork of that session;
* ``full`` — a fresh session of the edited history (prefill everything);
* ``peer_full`` — transformers ``DeepseekV3ForCausalLM`` prefilling the edited history;
* ``peer_crop`` — the same model cropping its ``DynamicCache`` of the old history at
  the first changed token and prefilling the rest;
* ``copy`` — what amortize's data movement is measured against: a plain indexed copy
  (``index_select`` + ``index_copy_``, in the torch kernel's row chunks) of the rows
  amortize moves, all layers. Amortize copies runs of neighbouring blocks as slices, so
  on an unfragmented pool it can beat this; ``--fragment-pool`` takes that away.

Contexts beyond the model's ``max_position_embeddings`` run with that limit
raised to ``--max-positions`` on both sides (RoPE needs no table).

``peer`` is the better of the two peer arms (by median). Reported: medians and
ratios to amortize.
"""

from __future__ import annotations

import argparse
import gc

import torch

from leyline_sdk.diff import apply_directives
from leyline_sdk.protocol import DirectiveBatch, SessionCreate

from leyline_runtime.inspection import Inspector
from leyline_runtime.model import load_model
from leyline_runtime.runtime import Runtime, RuntimeConfig
from ..common import plots
from ..common.histories import history_of_length, make_edit
from ..common.machine import runtime_info
from ..common.output import md_table, write_results
from ..common.prefix import common_prefix_length
from .peer import TransformersPeer, checkpoint_folder, scratch_dir
from ..common.stats import median, ratio, rotated, timed

TENANT = "__bench_edit__"
LEYLINE_ARMS = ("amortize", "forget", "full", "copy")
PEER_ARMS = ("peer_full", "peer_crop")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_parser(sub) -> None:
    p = sub.add_parser("edit")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192],
                   help="context lengths in tokens")
    p.add_argument("--positions", type=float, nargs="+", default=[0.1, 0.5, 0.9],
                   help="edit positions, as fractions of the context")
    p.add_argument("--spans", nargs="+", default=["message", "10pct"], choices=["message", "10pct", "10pct-delete"],
                   help="message: one tool output cleared; 10pct: a run of rounds (10%% of the context) "
                        "replaced by a one-line summary; 10pct-delete: the same run deleted")
    p.add_argument("--reps", type=int, default=3, help="repetitions per measurement")
    p.add_argument("--no-peer", action="store_true", help="skip the transformers peer")
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype")
    p.add_argument("--arms", nargs="+", default=None, choices=LEYLINE_ARMS + PEER_ARMS,
                   help="run only these arms (amortize always runs: the ratios are to it)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="skip the untimed round on the smallest context (it costs a whole cell)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="raise max_position_embeddings to this for the timing (both sides)")
    p.add_argument("--fragment-pool", action="store_true",
                   help="hand out cache blocks in random order (a pool after much churn): no two blocks of "
                        "a session are neighbours, so amortize moves rows by index, not as slices")
    p.set_defaults(run=run, quick_overrides={"contexts": [512], "positions": [0.5], "spans": ["message"],
                                             "reps": 1})


def _flat(tok, messages) -> list[int]:
    return [t for ids in tok.encode_messages(messages) for t in ids]


class EditCell:
    """One (context, position, span) cell: the edit, its arms, their samples."""

    def __init__(self, runtime: Runtime, peer, base_id: str, history, peer_cache, spec, only=None):
        self.runtime, self.peer, self.base_id, self.spec = runtime, peer, base_id, spec
        self.inspect = Inspector(runtime)
        self.only = only
        tok = runtime.tokenizer
        self.edited = apply_directives(history, [spec.directive])
        self.old_ids, self.new_ids = _flat(tok, history), _flat(tok, self.edited)
        self.keep = common_prefix_length(self.old_ids, self.new_ids)
        self.peer_cache = peer_cache
        self.outcomes: dict[str, dict] = {}

    def arms(self) -> tuple[str, ...]:
        arms = LEYLINE_ARMS + (PEER_ARMS if self.peer is not None else ())
        return tuple(a for a in arms if self.only is None or a in self.only or a == "amortize")

    def measure(self, arm: str) -> float:
        gc.collect()
        if arm in ("amortize", "forget"):
            return self._apply(arm)
        if arm == "full":
            seconds, info = timed(lambda: self.runtime.create_session(SessionCreate(messages=self.edited), TENANT))
            self.runtime.delete_session(info.session_id, TENANT)
            return seconds
        if arm == "copy":
            return self._copy()
        if arm == "peer_full":
            return timed(lambda: self.peer.prefill(self.new_ids))[0]
        cache = self.peer.copy_cache(self.peer_cache)
        return timed(lambda: self.peer.crop_and_prefill(cache, self.new_ids, self.keep))[0]

    def _moved_rows(self) -> int:
        """Rows amortize writes by copy or rotation: the common suffix, plus the kept block's head."""
        suffix = 0
        while (suffix < min(len(self.old_ids), len(self.new_ids)) - self.keep
               and self.old_ids[-1 - suffix] == self.new_ids[-1 - suffix]):
            suffix += 1
        return suffix + self.keep % self.runtime.config.block_size

    def _copy(self) -> float:
        end = len(self.old_ids)
        with self.inspect.scratch_row_copy(self.base_id, end - self._moved_rows(), end, TENANT) as copy:
            return timed(copy)[0]

    def _apply(self, mode: str) -> float:
        fork = self.inspect.fork(self.base_id, TENANT)  # an exact copy of the cached history, no prefill
        directive = self.spec.directive.model_copy(update={"mode": mode})
        try:
            seconds, result = timed(lambda: self.runtime.apply(
                DirectiveBatch(session_id=fork, directives=[directive]), TENANT))
        finally:
            self.runtime.delete_session(fork, TENANT)
        self.outcomes[mode] = result.outcomes[0].model_dump()
        return seconds


def _summarise(cell: EditCell, context: int, samples: dict[str, list[float]]) -> dict:
    med = {arm: median(v) for arm, v in samples.items()}
    peers = [med[a] for a in PEER_ARMS if a in med]
    if peers:
        med["peer"] = min(peers)
    base = med["amortize"]
    am = cell.outcomes.get("amortize", {})
    return {
        "context": context, "position": cell.spec.position, "span": cell.spec.span,
        "edit": {"start_token": cell.spec.start_token, "span_tokens": cell.spec.span_tokens,
                 "delta": am.get("delta"), "first_changed_token": cell.keep,
                 "rotated_tokens": am.get("rotated_tokens"), "recomputed_tokens": am.get("recomputed_tokens"),
                 "applied_mode": am.get("applied_mode"), "fallback_reason": am.get("fallback_reason"),
                 "forget_recomputed_tokens": cell.outcomes.get("forget", {}).get("recomputed_tokens")},
        "median_s": med,
        "ratio_to_amortize": {arm: ratio(v, base) for arm, v in med.items() if arm != "amortize"},
        "samples_s": samples,
    }


def _run_cell(cell: EditCell, context: int, reps: int) -> dict:
    samples: dict[str, list[float]] = {arm: [] for arm in cell.arms()}
    for r in range(reps):
        for arm in rotated(cell.arms(), r):
            samples[arm].append(cell.measure(arm))
    return _summarise(cell, context, samples)


def _context_cells(runtime, peer, n: int, args, log) -> list[dict]:
    tok = runtime.tokenizer
    history = history_of_length(tok, n)
    base_id = runtime.create_session(SessionCreate(messages=history), TENANT).session_id
    wants_crop = peer is not None and (args.arms is None or "peer_crop" in args.arms)
    peer_cache = peer.prefill(_flat(tok, history)) if wants_crop else None
    cells = []
    try:
        for position in args.positions:
            for span in args.spans:
                try:
                    spec = make_edit(tok, history, position, span)
                except ValueError as e:  # this history has no such edit
                    log(f"edit ctx={n} pos={position} span={span}: skipped: {e}")
                    continue
                cell = EditCell(runtime, peer, base_id, history, peer_cache, spec, args.arms)
                cells.append(_run_cell(cell, n, args.reps))
                log(_line(cells[-1]))
    finally:
        runtime.delete_session(base_id, TENANT)
    return cells


def _line(c: dict) -> str:
    m, r = c["median_s"], c["ratio_to_amortize"]
    others = ", ".join(f"{arm} {m[arm] * 1000:.0f} ms ({r[arm]:.2g}x)" for arm in ("copy", "forget", "full", "peer")
                       if arm in m)
    return (f"edit ctx={c['context']} pos={c['position']} span={c['span']}: amortize {m['amortize'] * 1000:.1f} ms, "
            + others)


def _warm_up(runtime, peer, n: int) -> None:
    """One untimed round of every arm on the smallest context: first calls pay one-time costs."""
    if n:
        warm = argparse.Namespace(positions=[0.5], spans=["message"], reps=1, arms=None)
        _context_cells(runtime, peer, n, warm, log=lambda _: None)


def run(args, log=print) -> dict:
    model = load_model(args.model, dtype=DTYPES[args.dtype])
    limit = model.config.max_position_embeddings = max(model.config.max_position_embeddings,
                                                       args.max_positions or 0)
    fits = [n for n in args.contexts if n <= limit] or [0]
    # base session + one fork + the fresh full session + forget's fresh blocks
    runtime = Runtime(RuntimeConfig(model_path=args.model, dtype=args.dtype,
                                    max_cache_tokens=4 * max(fits) + 256), model=model)
    if args.fragment_pool:
        Inspector(runtime).shuffle_free_blocks()
    skipped = [{"context": n, "note": f"skipped: exceeds the model's max_position_embeddings ({limit})"}
               for n in args.contexts if n > limit]
    with scratch_dir() as scratch:
        peer = None
        if not args.no_peer:
            peer = TransformersPeer(checkpoint_folder(args.model, runtime.model, scratch), runtime.model.dtype,
                                    max_position_embeddings=limit)
        if not args.quick and not args.no_warm_up:
            _warm_up(runtime, peer, min(fits))
        cells = [c for n in args.contexts if n <= limit for c in _context_cells(runtime, peer, n, args, log)]
    keys = ("contexts", "positions", "spans", "reps", "no_peer", "model", "dtype", "max_positions", "arms",
            "fragment_pool")
    result = {"benchmark": "edit", "settings": {k: getattr(args, k) for k in keys},
              "runtime": runtime_info(runtime), "cells": cells, "skipped": skipped,
              "notes": _notes(skipped, args.fragment_pool)}
    payload = write_results(args.out, "edit", result, "leyline-bench edit", _markdown(cells, skipped))
    _plot(args.out, cells)
    return payload


def _notes(skipped, fragment_pool: bool = False) -> list[str]:
    notes = ["Arms interleaved per repetition (order rotated); times are medians in seconds.",
             "amortize/forget run on an exact fork (row copy) of one cached session of the original history.",
             "peer = min(median peer_full, median peer_crop): transformers DeepseekV3ForCausalLM, same weights.",
             "copy = a plain indexed copy of the rows amortize moves (all layers, 2048-row chunks)."]
    if fragment_pool:
        notes.append("--fragment-pool: blocks handed out in random order, so amortize and copy both move rows "
                     "by index (no run of neighbouring blocks to copy as a slice).")
    return notes + [s["note"] + f" (context {s['context']})" for s in skipped]


def _ms(medians: dict, arm: str) -> float | None:
    return medians[arm] * 1000 if medians.get(arm) is not None else None


def _markdown(cells, skipped) -> str:
    headers = ["context", "position", "edit at token", "span", "δ", "amortize ms", "copy ms", "forget ms", "full ms",
               "peer ms", "amortize/copy", "forget/amortize", "full/amortize", "peer/amortize", "peer_full/forget"]
    rows = []
    for c in cells:
        r, m = c["ratio_to_amortize"], c["median_s"]
        ms = [_ms(m, arm) for arm in ("amortize", "copy", "forget", "full", "peer")]
        rows.append([c["context"], f"{c['position']:.0%}", c["edit"]["start_token"], c["span"], c["edit"]["delta"], *ms,
                     ratio(m["amortize"], m.get("copy")), r.get("forget"), r.get("full"), r.get("peer"),
                     ratio(m.get("peer_full"), m.get("forget"))])
    text = md_table(headers, rows)
    if skipped:
        text += "\n\n" + "\n".join(f"- context {s['context']}: {s['note']}" for s in skipped)
    return text + "\n\n![edit latency](edit_latency.png)\n![edit ratio](edit_ratio.png)\n"


def _plot(out, cells) -> None:
    if not cells:
        return
    contexts = sorted({c["context"] for c in cells})
    first = (cells[0]["position"], cells[0]["span"])

    def at(c, key):
        return next((x for x in cells if x["context"] == c and (x["position"], x["span"]) == key), None)

    arms = [a for a in ("amortize", "forget", "full", "peer") if a in cells[0]["median_s"]]
    series = {a: [(at(c, first) or {}).get("median_s", {}).get(a) for c in contexts] for a in arms}
    plots.lines(f"{out}/edit_latency.png", f"latency of one edit at {first[0]:.0%}, span {first[1]} (median)",
                contexts, series, "context (tokens)", "seconds", logx=True, logy=True)
    keys = sorted({(c["position"], c["span"]) for c in cells})
    arm = "peer" if "peer" in cells[0]["median_s"] else "forget"
    ratios = {f"{pos:.0%} {span}": [(at(c, (pos, span)) or {}).get("ratio_to_amortize", {}).get(arm)
                                    for c in contexts] for pos, span in keys}
    plots.lines(f"{out}/edit_ratio.png", f"{arm} / amortize (median latency ratio)", contexts, ratios,
                "context (tokens)", "× slower than amortize", logx=True, logy=True)
