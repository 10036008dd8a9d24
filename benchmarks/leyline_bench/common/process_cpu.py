"""CPU seconds a process group has spent, from ``/proc/<pid>/stat`` (Linux).

What a server costs per request, measured by what its processes spend rather than by wall time: on a
small shared machine wall time carries every other process's noise (two shared cores could not resolve
3% by wall time: paired ratios spread 0.80-1.16), while user + system time counts only the group's own
work. ``vllm serve`` started with ``start_new_session`` leads its own process group, so its API server,
EngineCore and worker processes are the group's members.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process whose process group is ``pgid``, in seconds."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while the table was read
            continue
        # the command name (field 2) may hold spaces and parentheses: split after its last ')'
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:  # pgrp, the 5th field of stat
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15
    return total / _TICKS
