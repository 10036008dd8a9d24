"""Synthetic fidelity on the bundled runtime (``leyline-bench fidelity``, ``--policies``): how far each edit mode's
output stays from an exact prefill over a generated workload, and what each history policy costs."""
