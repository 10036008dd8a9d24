"""The catalogue of repository-tool task kinds, weighed: :mod:`.transcripts` draws from :data:`KINDS`.

The kinds themselves: :mod:`.task_kinds_single` (one tool), :mod:`.task_kinds_chained` (several);
the player of their worked solutions: :mod:`.task_play`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .task_kinds_chained import _kind_compare, _kind_kv_calc, _kind_port_sum
from .task_kinds_single import (
    _kind_calc,
    _kind_constant,
    _kind_div_zero,
    _kind_kv,
    _kind_kv_missing,
    _kind_service_attr,
    _kind_tests,
    _kind_tests_all,
    _kind_tests_reason,
)
from .task_play import Play, Spec, say
from .world import World

__all__ = ["KINDS", "Play", "Spec", "say"]

KINDS: dict[str, tuple[float, Callable[[random.Random, World, str], Spec | None]]] = {
    "calc": (13, _kind_calc),
    "div_zero": (2, _kind_div_zero),
    "kv": (13, _kind_kv),
    "kv_missing": (3, _kind_kv_missing),
    "tests": (11, _kind_tests),
    "tests_all": (5, _kind_tests_all),
    "tests_reason": (6, _kind_tests_reason),
    "service_attr": (14, _kind_service_attr),
    "constant": (8, _kind_constant),
    "kv_calc": (10, _kind_kv_calc),
    "compare": (8, _kind_compare),
    "port_sum": (7, _kind_port_sum),
}
