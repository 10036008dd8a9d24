"""Drift against an exact prefill with transformers as the oracle (``leyline-bench drift | drift-real``): tiny GQA
and MLA models, then real weights on edits from real agent sessions, with the peers on the same edits (llama.cpp's
cache reuse, the plugin inside ``vllm serve``) and the removed-content questions."""
