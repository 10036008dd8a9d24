"""Directives: the executor that applies a batch to a session's cache (amortize / forget), auto mode, exact recompute."""
