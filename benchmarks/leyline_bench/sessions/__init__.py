"""Real agent sessions shipped with the bench, and what was measured on real agent traces.

* ``convert``: a mini-swe-agent trajectory into the OpenAI-style chat that Leyline's SDK
  and the LangChain adapter send (bash tool calls and tool messages).
* ``split``: which sessions are held out and which are for calibration (the sha1 rule).
* ``build``: the shipped subset, ``benchmarks/data/mini_swe_agent/sessions.jsonl.gz``, from a
  git snapshot of the source repository.
* ``load``: that file, read offline, as :class:`leyline_sdk.protocol.Message` lists.
* ``stats``: sizes of the shipped subset (``python -m leyline_bench.sessions.stats``).
* ``cache_breaks``: how often real Claude Code sessions lost cached KV blocks between turns,
  from kv-cache-tester's block-hash traces (``benchmarks/data/kv_cache_tester/``).
"""
