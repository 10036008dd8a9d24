"""What runs in vLLM's API-server process: Leyline's routes on ``vllm serve`` and the sessions behind
them. Talks to the KV side only through requests' ``kv_transfer_params`` (:mod:`leyline_vllm.kv.wire`)
and the worker extension's ``collective_rpc`` methods."""
