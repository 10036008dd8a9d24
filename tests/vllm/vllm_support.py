"""What this machine's vLLM can do (shared by the tests of this folder)."""

from leyline_bench.common.vllm_server import has_amx, vllm_on_cpu

# Without AMX, vLLM's CPU MLA backend switches its prefix cache off: the tests that need it say so.
NO_PREFIX_CACHE = vllm_on_cpu() and not has_amx()
NO_PREFIX_CACHE_REASON = ("this CPU has no AMX: vLLM's CPU_MLA backend disables prefix caching "
                          "(vLLM's own prefix cache cannot be exercised here)")
