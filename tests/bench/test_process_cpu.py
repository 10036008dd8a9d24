"""The tax cell's CPU accounting: a process group's utime + stime read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from leyline_bench.common.process_cpu import group_cpu_seconds
from leyline_bench.vllm.cells import tax_markdown

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n" \
       "import subprocess, sys\nsubprocess.run([sys.executable, '-c', " \
       "'import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass\\ntime.sleep(30)'])"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_a_group_counts_its_members_cpu_and_no_one_elses():
    # a leader that burns 0.4 s of CPU, then a child (same group) that burns 0.4 s and stays alive
    leader = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while group_cpu_seconds(leader.pid) < 0.75 and time.monotonic() < deadline:
            time.sleep(0.1)
        spent = group_cpu_seconds(leader.pid)
        assert 0.75 <= spent < 5.0, spent  # both members' work, read while they live
        assert group_cpu_seconds(leader.pid + 10**7) == 0.0  # a group with no members
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_the_tax_report_puts_cpu_time_beside_wall_time():
    def spread(values):
        return {"median": sorted(values)[len(values) // 2], "min": min(values), "max": max(values), "values": values}

    stream = {"plain": spread([200.0, 210.0]), "plugin": spread([190.0, 205.0]), "plugin_over_plain": spread([0.95, 0.976]),
              "tax": 0.024, "wall_s": spread([19.0, 20.0]), "resent": 0,
              "cpu_s_per_request": {"plain": spread([0.5, 0.55]), "plugin": spread([0.52, 0.56])},
              "cpu_plugin_over_plain": spread([1.04, 1.018]), "cpu_tax": 0.029}
    text = "\n".join(tax_markdown({"tokens_per_request": 64, "requests_per_measurement": 64, "repeats": 2,
                                   "streams": {"1": stream}}))
    assert "CPU seconds per request" in text and "+2.9%" in text and "+2.4%" in text
    assert "| 1 | 550 | 500.0–550.0 | 560 | 520.0–560.0 |" in text, text
