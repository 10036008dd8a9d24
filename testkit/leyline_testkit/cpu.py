"""Which CPU a number came from: its model name and the vector extensions that change what is fast.

"AMD EPYC" alone names machines as different as an AVX2-only one and one with AVX512-BF16; vLLM's CPU
build computes bf16 natively only with AVX512-BF16 or AMX (and keeps its MLA prefix cache only with AMX),
so results say which of these the machine had. Torch-free: the vLLM helpers read it too.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path


def _cpuinfo_field(name: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


@cache
def cpu_flags() -> frozenset[str]:
    return frozenset((_cpuinfo_field("flags") or "").split())


def has_amx() -> bool:
    return "amx_tile" in cpu_flags()


def has_native_bf16() -> bool:
    """bf16 arithmetic in hardware (AVX512-BF16 or AMX); without it vLLM's CPU kernels emulate bf16."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_isa() -> str:
    """The widest of the extensions that decide CPU inference speed here, as the reports print it."""
    flags = cpu_flags()
    if "amx_tile" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16, no AMX"
    if "avx512f" in flags:
        return "AVX512, no BF16"
    if "avx2" in flags:
        return "AVX2 only"
    return platform.machine()
