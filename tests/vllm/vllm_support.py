"""The configurations vLLM's CPU MLA runs in, and how the tests serve each one on any CPU.

vLLM picks the MLA backend from the CPU's flags: with AMX, AMX_MLA (bf16 only; vLLM's prefix cache on);
without it, the reference CPU_MLA backend (fp32 here; vLLM switches its prefix cache off). The MLA
directive tests run in both on every CPU (``MLA_CONFIGS``):

* ``fp32``: the CPU_MLA backend named with ``--attention-backend`` (an AMX CPU would pick AMX_MLA, which
  has no fp32), so vLLM's own rule switches the prefix cache off, as on every CPU without AMX;
* ``bf16-prefix-cache``: ``--dtype bfloat16``; where the CPU has no AMX, vLLM's CPU_MLA backend would
  switch the prefix cache off, so the plugin's test hook (``leyline_vllm.test_config``,
  ``LEYLINE_VLLM_TEST_PREFIX_CACHE=1``) turns it back on in every vLLM process of that server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

from leyline_testkit.vllm_server import default_dtype, has_amx, vllm_on_cpu


@dataclass(frozen=True)
class MlaConfig:
    name: str
    dtype: str
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def mla_configs() -> list[MlaConfig]:
    cpu = vllm_on_cpu()
    force_cache = {"LEYLINE_VLLM_TEST_PREFIX_CACHE": "1"} if cpu and not has_amx() else {}
    return [MlaConfig("fp32", "float32", ["--attention-backend", "CPU_MLA"] if cpu else ["--no-enable-prefix-caching"]),
            MlaConfig("bf16-prefix-cache", "bfloat16", env=force_cache)]


def native_mla_config() -> str | None:
    """The configuration the folder's shared server runs in (``VllmServer``'s default dtype on the CPU
    build, where the dtype decides the MLA backend and so the prefix cache); None where it is neither."""
    if not vllm_on_cpu():
        return None  # a GPU keeps its prefix cache in fp32 too: both configurations get a server of their own
    return {"bfloat16": "bf16-prefix-cache", "float32": "fp32"}[default_dtype()]


def cache_config(base_url: str) -> dict[str, str]:
    """vLLM's cache config as its ``cache_config_info`` metric states it (block size, prefix caching)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found = re.search(r"vllm:cache_config_info\{([^}]*)\}", text)
    assert found, "vLLM's /metrics has no cache_config_info"
    return dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
