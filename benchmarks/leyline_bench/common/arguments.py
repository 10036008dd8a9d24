"""Command-line argument types shared by the benches."""

from __future__ import annotations

import argparse


def comma_list(known: tuple[str, ...]):
    """An argparse type: a comma list of names, each one of ``known``."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            # ArgumentTypeError: argparse shows this message (a ValueError's it replaces by 'invalid value')
            raise argparse.ArgumentTypeError(f"a comma list of {', '.join(known)}; got {text!r}")
        return names
    return parse
