"""``leyline-bench`` entry point: one argparse subcommand per benchmark.

Every subcommand writes ``<out>/<name>.json`` (with machine, command line and
git commit), ``<out>/<name>.md`` and PNG plots; ``--quick`` swaps in tiny
settings for smoke tests.
"""

from __future__ import annotations

import argparse
import sys

from leyline_runtime.extras import MissingExtra, require


def build_parser() -> argparse.ArgumentParser:
    # The subcommands import torch and the runtime at module level: check the extra first.
    require("bench", "leyline-bench")
    from . import chaos, edit, fidelity, gemm, grammar, kernel, prefill, replay, serve, vllm

    parser = argparse.ArgumentParser(prog="leyline-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (edit, kernel, gemm, fidelity, grammar, prefill, replay, serve, chaos, vllm):
        module.add_parser(sub)
    for p in sub.choices.values():
        p.add_argument("--out", default="bench-out", help="output folder (default: bench-out/)")
        p.add_argument("--quick", action="store_true", help="tiny settings for smoke tests")
        p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        # Quick settings replace the defaults, never what was given on the command line.
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for key, value in args.quick_overrides.items():
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
    except MissingExtra as exc:
        print(f"leyline-bench: error: {exc}", file=sys.stderr, flush=True)
        return 1
    from .machine import set_command

    set_command(["leyline-bench", *argv])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    payload = args.run(args)
    name = payload.get("benchmark", args.command)
    print(f"wrote {args.out}/{name}.json and {args.out}/{name}.md")
    return 0 if not payload.get("failed") else 1


if __name__ == "__main__":
    sys.exit(main())
