"""``leyline-train`` (also ``python -m leyline_training``): train and evaluate the default model.

Building the parser imports no torch (the flags live in the torch-free
:mod:`.cli`); the trainer and evaluator are imported when their command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from leyline_runtime.cli import command_parser, run_command
from leyline_runtime.extras import require
from leyline_training.cli import EVALUATE_HELP, TRAIN_HELP, add_evaluate_arguments, add_train_arguments


def _run_train(args: argparse.Namespace) -> int:
    require("runtime", "leyline-train train")
    from leyline_training import train

    train.run(args)
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    require("runtime", "leyline-train evaluate")
    from leyline_training import evaluate

    evaluate.run(args)
    return 0


COMMANDS = {
    "train": (TRAIN_HELP, add_train_arguments, _run_train),
    "evaluate": (EVALUATE_HELP, add_evaluate_arguments, _run_evaluate),
}


def build_parser() -> argparse.ArgumentParser:
    return command_parser("leyline-train", "Train and evaluate Leyline's embedded default model.", COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
