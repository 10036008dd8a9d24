"""How far edits move a model's output from an exact prefill (``leyline-bench fidelity | drift | drift-real``):
workloads, the transformers oracle, real edits and the removed-content questions."""
