"""Helpers every family uses: result files and their provenance, plots, statistics, an in-process server, agent-
like text and histories of an exact length."""
