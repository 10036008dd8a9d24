"""Faults the project's own tests inject into the worker side (never set in production).

Each variable names sessions (comma-separated ``session`` labels of :mod:`leyline_vllm.kv.wire`): their
loads fail after layer 0 is written, are copied without rotation, are rotated with the other pairing,
or their holds go to the host tier as soon as they are made; ``LEYLINE_VLLM_TEST_PROBE_FAULT=1`` makes
the cache registration fail as a broken layout probe would. Read once, when the connector is built:
with none set, :func:`from_env` returns None and no production path looks at them again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FAULT_ENV = "LEYLINE_VLLM_TEST_FAULT_SESSIONS"
NO_ROTATE_ENV = "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS"
WRONG_PAIRING_ENV = "LEYLINE_VLLM_TEST_WRONG_PAIRING_SESSIONS"
SPILL_ENV = "LEYLINE_VLLM_TEST_SPILL_SESSIONS"
PROBE_FAULT_ENV = "LEYLINE_VLLM_TEST_PROBE_FAULT"
OTHER_PAIRING = {"half_split": "interleaved", "interleaved": "half_split"}


def _sessions(env: str) -> frozenset[str]:
    return frozenset(s for s in os.environ.get(env, "").split(",") if s)


@dataclass(frozen=True)
class TestFaults:
    fail_after_layer0: frozenset[str]
    no_rotate: frozenset[str]
    wrong_pairing: frozenset[str]
    spill_at_once: frozenset[str]
    probe: bool

    def pairing(self, session: str, pairing: str) -> str:
        return OTHER_PAIRING[pairing] if session in self.wrong_pairing else pairing


def from_env() -> TestFaults | None:
    faults = TestFaults(_sessions(FAULT_ENV), _sessions(NO_ROTATE_ENV), _sessions(WRONG_PAIRING_ENV),
                        _sessions(SPILL_ENV), os.environ.get(PROBE_FAULT_ENV) == "1")
    return faults if any((faults.fail_after_layer0, faults.no_rotate, faults.wrong_pairing, faults.spill_at_once,
                          faults.probe)) else None
