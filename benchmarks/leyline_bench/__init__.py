"""``leyline-bench``: edits, kernels, fidelity, agent replays and HTTP load, side by side.

Every subcommand measures its arms interleaved in one run (the machine may be
shared and noisy), reports medians and ratios, and writes
``<out>/<name>.json`` + ``<out>/<name>.md`` + PNG plots. See ``cli.py``.
"""
