"""Prefill throughput of the embedded default model (issue 2's closing numbers).

    .venv/bin/python scripts/measure_prefill.py [--contexts 512 2048 4096] [--reps 3]

Prints JSON: median tokens/s per (dtype, context), prefill through the paged
cache path the runtime serves with (chunked, 512-token chunks).
"""

import argparse
import json
import platform
import statistics
import time

import torch

from leyline_runtime.kv_cache import BlockTable, ensure_capacity
from leyline_runtime.runtime import Runtime, RuntimeConfig


def measure(dtype: str, contexts: list[int], reps: int) -> dict:
    rt = Runtime(RuntimeConfig(dtype=dtype, max_cache_tokens=max(contexts) + 64))
    vocab = rt.model.config.vocab_size
    out = {}
    for n in contexts:
        tokens = torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        times = []
        for _ in range(reps):
            table = BlockTable(rt.pool.block_size)
            ensure_capacity(rt.pool, table, n)
            t0 = time.perf_counter()
            rt.engine.prefill(table, tokens, 0)
            times.append(time.perf_counter() - t0)
            rt.pool.free(table.blocks)
        out[str(n)] = {"median_s": statistics.median(times), "tokens_per_s": n / statistics.median(times)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "prefill": {dtype: measure(dtype, args.contexts, args.reps) for dtype in ("float32", "bfloat16")},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
