"""leyline-bench: one subcommand per benchmark.

Every subcommand writes <out>/<name>.json (with the machine, the command line and
the git commit), <out>/<name>.md and PNG plots; --quick swaps in tiny settings
for smoke tests. "leyline-bench COMMAND --help" lists a command's flags.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from leyline_runtime.extras import MissingExtra, require

# name -> (module in this package: family.module, one-line help). Only the module of the command being run is imported:
# the benchmark modules import torch and the runtime at module level, and --help should not wait for them.
COMMANDS: dict[str, tuple[str, str]] = {
    "edit": ("micro.edit", "latency of one edit: amortize / forget / full re-prefill / transformers peer"),
    "kernel": ("micro.kernel", "rotate_and_splice GB/s against a plain torch copy of the same rows"),
    "gemm": ("micro.gemm", "the model's fp32 matrix products on BLAS (MKL) against oneDNN, by row count"),
    "fidelity": ("fidelity.fidelity", "how close each edit mode's output stays to a full re-prefill, over a workload JSONL"),
    "grammar": ("micro.grammar", "per-token cost of constrained decoding (llguidance masks)"),
    "prefill": ("micro.prefill", "prefill tokens/s: Leyline's engine against transformers, same weights"),
    "replay": ("agent.replay", "replay agent traces: no cache / prefix cache / Leyline amortize / forget"),
    "serve": ("serve.serve", "HTTP load: concurrent edit + generate sessions"),
    "chaos": ("serve.chaos", "mixed valid and invalid load from many clients on a served runtime"),
    "claude-code": ("agent.claude_code", "Claude Code (claude -p) on a real model through vllm serve, with the plugin "
                                         "and without: what it sends, the task's tool round trip, prompt tokens "
                                         "computed (needs .venv-vllm, npm)"),
    "agent": ("agent.agent", "LangGraph agents end to end: solve rate, tokens computed and wall time, with and without edits"),
    "drift": ("drift.drift", "amortize / forget / auto drift on GQA and MLA models, transformers as the oracle"),
    "drift-agent": ("drift.drift_agent", "the next action after real edits under amortize / repairs / auto / forget "
                                        "against an exact prefill: same action, same command word, KL, margin"),
    "drift-real": ("drift.drift_real", "amortize / repair / auto / forget on real weights and edits from real agent "
                                 "sessions: next turn, greedy tokens, removed-content questions"),
    "vllm": ("vllm.vllm", "directives inside vllm serve with Leyline's plugins (needs .venv-vllm)"),
    "traces": ("traces.traces", "real agent sessions replayed through the history policies frameworks apply: "
                               "prompt tokens computed vs the floor, TTFT; vLLM, Leyline, llama.cpp, the runtime"),
    "traces-bound": ("traces.bound", "arithmetic, no server: what a prefix cache and the floor compute on the real "
                                     "sessions, per policy and context budget (the ceiling of a splicing engine)"),
    "portability": ("vllm.portability", "per RoPE family: the vLLM plugin's verdict, rotation error, forget vs fresh, "
                                   "TTFT (needs .venv-vllm)"),
}


def build_parser(load: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The parser; the commands in ``load`` (default: all) get their flags, importing their modules; the others
    only a name and a line of help."""
    load = tuple(COMMANDS) if load is None else load
    parser = argparse.ArgumentParser(prog="leyline-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if load:
        require("runtime", "leyline-bench")
    for name, (module_name, help_text) in COMMANDS.items():
        if name not in load:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(f"{__package__}.{module_name}")
        module.add_parser(sub)
        p = sub.choices[name]
        p.description = help_text
        p.add_argument("--out", default="bench-out", help="output folder (default: bench-out/)")
        p.add_argument("--quick", action="store_true", help="tiny settings for smoke tests")
        p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser


def command_in(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a flag), if it is one we know."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_in(argv)
    args = build_parser((command,) if command else ()).parse_args(argv)
    if args.quick:
        # Quick settings replace the defaults, never what was given on the command line.
        given = {a.split("=")[0] for a in argv if a.startswith("--")}
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
    from .common.machine import set_command

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
