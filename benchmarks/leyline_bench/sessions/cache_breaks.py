"""How often real Claude Code sessions lose cached KV blocks between turns (kv-cache-tester traces).

    python -m leyline_bench.sessions.cache_breaks TRACE_DIR [--first 60] [--spread 1000]
        [--source-commit C] [--out benchmarks/data/kv_cache_tester/cache_breaks.json]

callanjfox/kv-cache-tester's ``traces/trace_*.json`` hold no text: each request carries
``in`` (its input tokens) and ``hash_ids``, one id per 64-token block of its input (the
trace's ``block_size``), the same id for the same block content and position, scoped to
the conversation. Here, per trace, over the parent conversation's requests in order
(entries of ``type: "subagent"`` are separate conversations and are left out, as the
repository's own cache-rate figures leave them out):

* *context at the end*: ``in`` of the last request.
* A *turn transition* is a pair of consecutive requests. Its *kept* blocks are the longest
  common prefix of the two ``hash_ids`` lists (what a prefix cache can reuse); its
  *dropped* blocks are the previous request's blocks beyond that prefix. A transition that
  drops more than one block is a *break* (one dropped block is ordinary: the previous
  request's last block grows when text is appended).
* *where*: kept blocks / the previous request's blocks, the share of the context before the
  break; *tokens*: dropped blocks x block size, cached tokens the next request cannot reuse.
  *shrinking* breaks are those whose next request is shorter than the previous one
  (a compaction or a restart rather than an edit).

The summary names the traces used: the first N files by name (``--first``), and all the
files in the folder; ``--spread`` draws that many random samples of N traces (seeded) and
gives the 5th-95th percentile range of each figure, to judge a figure from one sample of N.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.prefix import common_prefix_length

SOURCE_REPO = "callanjfox/kv-cache-tester"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "kv_cache_tester" / "cache_breaks.json"


@dataclass(frozen=True)
class Break:
    kept_share: float  # of the previous request's blocks
    dropped_tokens: int
    shrinking: bool


@dataclass(frozen=True)
class TraceBreaks:
    name: str
    end_context_tokens: int
    transitions: int
    breaks: list[Break]


def trace_breaks(name: str, trace: dict[str, Any]) -> TraceBreaks:
    block = trace["block_size"]
    requests = [r for r in trace["requests"] if r.get("type") != "subagent"]
    breaks = []
    for previous, current in itertools.pairwise(requests):
        before, after = previous["hash_ids"], current["hash_ids"]
        kept = common_prefix_length(before, after)
        if len(before) - kept > 1:
            breaks.append(Break(kept_share=kept / len(before), dropped_tokens=(len(before) - kept) * block,
                                shrinking=len(after) < len(before)))
    return TraceBreaks(name=name, end_context_tokens=requests[-1]["in"], transitions=len(requests) - 1,
                       breaks=breaks)


def summarise(traces: list[TraceBreaks]) -> dict[str, Any]:
    breaks = [b for t in traces for b in t.breaks]
    transitions = sum(t.transitions for t in traces)
    return {
        "traces": len(traces),
        "end_context_tokens_median": statistics.median(t.end_context_tokens for t in traces),
        "transitions": transitions,
        "breaks": len(breaks),
        "break_share": len(breaks) / transitions if transitions else None,
        "traces_with_a_break": sum(bool(t.breaks) for t in traces),
        "break_kept_share_median": statistics.median(b.kept_share for b in breaks) if breaks else None,
        "break_dropped_tokens_median": statistics.median(b.dropped_tokens for b in breaks) if breaks else None,
        "break_dropped_tokens_mean": statistics.fmean(b.dropped_tokens for b in breaks) if breaks else None,
        "shrinking_breaks": sum(b.shrinking for b in breaks),
    }


SPREAD_FIGURES = ("end_context_tokens_median", "break_share", "break_kept_share_median", "break_dropped_tokens_median")


def spread(traces: list[TraceBreaks], size: int, draws: int, seed: int) -> dict[str, Any]:
    """The 5th-95th percentile range of each figure over ``draws`` random samples of ``size`` traces."""
    rng = random.Random(seed)
    samples = [summarise(rng.sample(traces, size)) for _ in range(draws)]
    ranges: dict[str, Any] = {"sample_size": size, "draws": draws, "seed": seed}
    for figure in SPREAD_FIGURES:
        values = sorted(s[figure] for s in samples if s[figure] is not None)
        ranges[figure] = [values[round(0.05 * (len(values) - 1))], values[round(0.95 * (len(values) - 1))]]
    return ranges


def load_folder(folder: Path) -> list[TraceBreaks]:
    return [trace_breaks(p.name, json.loads(p.read_text())) for p in sorted(folder.glob("trace_*.json"))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--first", type=int, default=60)
    parser.add_argument("--spread", type=int, default=1000, help="random samples of --first traces (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source-commit", default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the summary here too (JSON)")
    args = parser.parse_args(argv)
    traces = load_folder(args.trace_dir)
    if len(traces) < args.first:
        raise SystemExit(f"{args.trace_dir}: {len(traces)} traces, fewer than --first {args.first}")
    summary: dict[str, Any] = {
        "source": SOURCE_REPO, "source_commit": args.source_commit, "definitions": __doc__.split("\n\n", 2)[2],
        f"first_{args.first}": {"files": [t.name for t in traces[:args.first]], **summarise(traces[:args.first])},
        "all": {"files": len(traces), **summarise(traces)},
    }
    if args.spread:
        summary[f"random_samples_of_{args.first}"] = spread(traces, args.first, args.spread, args.seed)
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
