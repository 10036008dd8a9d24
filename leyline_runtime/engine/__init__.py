"""The engine: one thread that schedules sequences over the paged KV cache and runs the model (scheduler, sequence, model_runner, kv_cache, sampling, grammar)."""
