"""The common prefix of two token sequences: what a prefix cache keeps from one prompt to the next."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
