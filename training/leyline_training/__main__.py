"""``leyline-train`` (also ``python -m leyline_training``): train and evaluate the default model.

Building the parser imports no torch (the flags live in the torch-free
:mod:`.cli`); the trainer and evaluator are imported when their command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from leyline_runtime.extras import MissingExtra, require
from leyline_training.cli import EVALUATE_HELP, TRAIN_HELP, add_evaluate_arguments, add_train_arguments


def _run_train(args: argparse.Namespace) -> int:
    require("train", "leyline-train train")
    from leyline_training import train

    train.run(args)
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    require("train", "leyline-train evaluate")
    from leyline_training import evaluate

    evaluate.run(args)
    return 0


COMMANDS = {
    "train": (TRAIN_HELP, add_train_arguments, _run_train),
    "evaluate": (EVALUATE_HELP, add_evaluate_arguments, _run_evaluate),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leyline-train", description="Train and evaluate Leyline's embedded default model.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MissingExtra as exc:
        print(f"leyline-train: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
