"""Backend choice and the dispatching entry point.

``LEYLINE_KERNEL=triton|torch`` overrides the choice; otherwise the Triton
kernel runs for CUDA pools when triton imports, the torch path everywhere else.
"""

from __future__ import annotations

import os

import torch

from .rotate_and_splice_torch import rotate_and_splice_torch
from .rotate_and_splice_triton import rotate_and_splice_triton, triton_available

__all__ = ["kernel_backend", "rotate_and_splice", "ENV_VAR", "BACKENDS"]

ENV_VAR = "LEYLINE_KERNEL"
BACKENDS = ("triton", "torch")


def _device_of(device) -> torch.device:
    if isinstance(device, torch.Tensor):
        return device.device
    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"not a device: {device!r}") from e


def kernel_backend(device=None) -> str:
    """``"triton"`` or ``"torch"`` for pools on ``device`` (a device, a device
    string or a tensor).  ``LEYLINE_KERNEL`` overrides; an unknown value raises
    ``ValueError``."""
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"{ENV_VAR} must be one of {BACKENDS}, got {forced!r}")
        return forced
    dev = _device_of(device)
    if dev.type == "cuda" and triton_available():
        return "triton"
    return "torch"


def rotate_and_splice(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
    delta_index: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_offset: int,
    rope_dim: int,
    pair_layout: str = "half_split",
) -> None:
    """Run rotate-and-splice on the backend chosen by :func:`kernel_backend`
    for the pools' device (each backend validates its arguments).
    ``pair_layout``: ``"half_split"`` (default) or ``"interleaved"``."""
    run = rotate_and_splice_triton if kernel_backend(src_pool.device) == "triton" else rotate_and_splice_torch
    run(src_pool, dst_pool, src_rows, dst_rows, delta_index, cos, sin, rope_offset, rope_dim,
        pair_layout=pair_layout)
