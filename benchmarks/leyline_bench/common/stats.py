"""Small statistics helpers: medians, percentiles, ratios, timers."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile, ``q`` in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def rotated(items: Sequence, k: int) -> list:
    """``items`` rotated left by ``k``: interleaved arms change order every repetition."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])
