"""What the project's own tests force in vLLM's configuration (never set in production).

``LEYLINE_VLLM_TEST_PREFIX_CACHE=1`` keeps vLLM's prefix cache on for CPU MLA. vLLM decides it from the
CPU's flags: its AMX MLA backend keeps the cache, the reference CPU MLA backend (every CPU without AMX)
switches it off in ``CpuPlatform.check_and_update_config``. The tests run the MLA directive checks in
what an AMX CPU runs (bf16, prefix cache on) on any CPU, so this wraps that hook in every vLLM process
(the general plugin loads before the config is built) and turns the cache back on after it. The
reference backend then sees prompts whose first blocks vLLM's cache supplied, as it already does for
the blocks Leyline's connector loads.
"""

from __future__ import annotations

import os

PREFIX_CACHE_ENV = "LEYLINE_VLLM_TEST_PREFIX_CACHE"


def apply_from_env() -> None:
    if os.environ.get(PREFIX_CACHE_ENV) != "1":
        return
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if not current_platform.is_cpu() or getattr(platform, "_leyline_prefix_cache_forced", False):
        return
    decide = platform.check_and_update_config

    def check_and_update_config(cls, vllm_config) -> None:
        decide(vllm_config)
        vllm_config.cache_config.enable_prefix_caching = True

    platform.check_and_update_config = classmethod(check_and_update_config)
    platform._leyline_prefix_cache_forced = True
