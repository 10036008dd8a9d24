"""``leyline-bench kernel``: rotate-and-splice bandwidth vs a plain copy of the same rows.

Rows of the default model's cache layout (``kv_lora_rank + qk_rope_head_dim``
wide) are spread over a paged pool (random blocks of 16); every arm reads
``rows`` rows and writes ``rows`` rows, so GB/s = 2 · rows · width · itemsize / time.
The plain ``torch`` copy ``pool[dst] = pool[src]`` on the same device is the
practical bandwidth limit. Triton runs only where CUDA exists.
"""

from __future__ import annotations

from pathlib import Path

import torch

from leyline_kernels import delta_rotation_table, rotate_and_splice_torch
from leyline_kernels.rotate_and_splice_triton import triton_available

from leyline_runtime.model import read_config
from leyline_runtime.model.default import DEFAULT_MODEL_DIR, default_config
from ..common import plots
from ..common.output import md_table, write_results
from ..common.stats import median, ratio, rotated, timed

BLOCK = 16
DELTA = -100  # one distinct δ (one edit); the table has one row
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_parser(sub) -> None:
    p = sub.add_parser("kernel")
    p.add_argument("--rows", type=int, nargs="+", default=[1024 * 2 ** i for i in range(7)], help="row counts to copy")
    p.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES),
                   help="row dtypes to measure (default: %(default)s)")
    p.add_argument("--reps", type=int, default=15, help="repetitions per measurement")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--model", default=None, help="take the row layout from this model folder")
    p.set_defaults(run=run, quick_overrides={"rows": [1024, 4096], "reps": 3})


def model_config(model: str | None = None):
    """The config of ``model`` (a folder), else of the embedded default model."""
    folder = Path(model) if model else DEFAULT_MODEL_DIR
    if (folder / "config.json").is_file():
        return read_config(folder)
    return default_config(vocab_size=8192)  # the seeded default: the vocabulary does not shape the cache


def layout(model: str | None = None) -> tuple[int, int, int, float]:
    """(row width, rope offset, rope dim, rope theta) of the model's cache rows."""
    cfg = model_config(model)
    return cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.rope_theta


def paged_rows(n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Source and destination rows in disjoint random blocks of a pool of 3n rows."""
    blocks = -(-n // BLOCK)
    perm = torch.randperm(3 * blocks, generator=torch.Generator().manual_seed(seed))
    slots = torch.arange(BLOCK)

    def rows(bs):
        return (bs[:, None] * BLOCK + slots).flatten()[:n]

    return rows(perm[:blocks]).to(device), rows(perm[blocks:2 * blocks]).to(device), 3 * blocks * BLOCK


class KernelCase:
    def __init__(self, n: int, dtype: torch.dtype, device: str, model: str | None = None):
        width, self.offset, self.rope, theta = layout(model)
        self.src, self.dst, pool_rows = paged_rows(n, device)
        self.pool = torch.randn(pool_rows, width, device=device).to(dtype)
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.rope, 2, dtype=torch.float64) / self.rope))
        self.index, self.cos, self.sin = delta_rotation_table(torch.full((n,), DELTA), inv_freq, device)
        self.bytes = 2 * n * width * self.pool.element_size()
        self.device = device

    def arms(self) -> dict:
        arms = {"copy": self.copy, "torch": self.torch_path}
        if self.device.startswith("cuda") and triton_available():
            arms["triton"] = self.triton_path
        return arms

    def copy(self):
        self.pool[self.dst] = self.pool[self.src]

    def torch_path(self):
        rotate_and_splice_torch(self.pool, self.pool, self.src, self.dst, self.index, self.cos, self.sin,
                                self.offset, self.rope)

    def triton_path(self):
        from leyline_kernels import rotate_and_splice_triton

        rotate_and_splice_triton(self.pool, self.pool, self.src, self.dst, self.index, self.cos, self.sin,
                                 self.offset, self.rope)

    def time(self, fn) -> float:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            seconds = timed(lambda: (fn(), torch.cuda.synchronize()))[0]
        else:
            seconds = timed(fn)[0]
        return seconds


def _measure(n: int, dtype_name: str, device: str, reps: int, model: str | None) -> dict:
    case = KernelCase(n, DTYPES[dtype_name], device, model)
    arms = case.arms()
    for fn in arms.values():
        fn()  # warm-up (and Triton compile)
    samples = {name: [] for name in arms}
    for r in range(reps):
        for name in rotated(list(arms), r):
            samples[name].append(case.time(arms[name]))
    gbps = {name: case.bytes / median(v) / 1e9 for name, v in samples.items()}
    row = {"rows": n, "dtype": dtype_name, "bytes_moved": case.bytes, "median_s": {k: median(v) for k, v in
                                                                                     samples.items()},
           "gb_per_s": gbps, "torch_vs_copy": ratio(gbps["torch"], gbps["copy"])}
    if "triton" in gbps:
        row["triton_vs_copy"] = ratio(gbps["triton"], gbps["copy"])
    return row


def run(args, log=print) -> dict:
    triton_note = None if args.device.startswith("cuda") and triton_available() else "skipped: no GPU"
    results = []
    for dtype_name in args.dtype:
        for n in args.rows:
            results.append(_measure(n, dtype_name, args.device, args.reps, args.model))
            r = results[-1]
            log(f"kernel {dtype_name} rows={n}: copy {r['gb_per_s']['copy']:.2f} GB/s, "
                f"torch {r['gb_per_s']['torch']:.2f} GB/s ({r['torch_vs_copy']:.2f} of copy)")
    width, offset, rope, _ = layout(args.model)
    result = {"benchmark": "kernel", "device": args.device,
              "settings": {"rows": args.rows, "dtype": args.dtype, "reps": args.reps, "row_width": width,
                           "rope_offset": offset, "rope_dim": rope, "block_size": BLOCK, "delta": DELTA},
              "triton": triton_note or "measured", "results": results,
              "notes": ["GB/s = (bytes read + bytes written) / median time; arms interleaved, order rotated.",
                        f"Triton path: {triton_note or 'measured'}."]}
    payload = write_results(args.out, "kernel", result, "leyline-bench kernel", _markdown(results, triton_note))
    _plot(args.out, results, args.dtype)
    return payload


def _markdown(results, triton_note) -> str:
    headers = ["dtype", "rows", "MB moved", "copy GB/s", "torch GB/s", "torch/copy", "triton GB/s", "triton/copy"]
    rows = [[r["dtype"], r["rows"], r["bytes_moved"] / 1e6, r["gb_per_s"]["copy"], r["gb_per_s"]["torch"],
             r["torch_vs_copy"], r["gb_per_s"].get("triton", triton_note), r.get("triton_vs_copy")]
            for r in results]
    return md_table(headers, rows) + "\n\n![kernel bandwidth](kernel.png)\n"


def _plot(out, results, dtypes) -> None:
    if not results:
        return
    series = {}
    xs = sorted({r["rows"] for r in results})
    for d in dtypes:
        by_rows = {r["rows"]: r for r in results if r["dtype"] == d}
        for arm in ("copy", "torch", "triton"):
            values = [by_rows[n]["gb_per_s"].get(arm) if n in by_rows else None for n in xs]
            if any(v is not None for v in values):
                series[f"{arm} {d}"] = values
    plots.lines(f"{out}/kernel.png", "rotate-and-splice vs plain copy", xs, series, "rows", "GB/s", logx=True)
