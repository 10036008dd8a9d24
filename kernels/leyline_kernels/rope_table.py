"""Host-side construction of the delta-rotation table.

Moving a token from position ``p`` to ``p + delta`` rotates its rope key by
``delta * inv_freq`` (RoPE rotations compose).  The angles are built here on
the host in float64 directly from ``delta`` -- never as the difference of two
fp32 absolute angles, and never read from a cached cos/sin table (those may
carry YaRN's attention scaling).  One table row is emitted per *distinct*
delta; every row of the edit indexes it through ``delta_index``.
"""

from __future__ import annotations

import torch

__all__ = ["delta_rotation_table"]


def delta_rotation_table(
    deltas: torch.Tensor,
    inv_freq: torch.Tensor,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build ``(delta_index, cos, sin)`` for a batch of per-row deltas.

    Args:
        deltas: integer tensor (or sequence), one delta per row to move.
        inv_freq: the ``rope_dim / 2`` unit-magnitude inverse frequencies
            (already YaRN-blended if the model uses YaRN), any float dtype;
            converted to float64.
        device: where the returned tensors go (default: ``deltas``' device).

    Returns:
        ``delta_index``: int64 ``[n]``, row ``i`` uses table row ``delta_index[i]``;
        ``cos``, ``sin``: fp32 ``[n_distinct, rope_dim / 2]`` holding
        ``cos/sin(delta * inv_freq)`` evaluated in float64 then rounded to fp32.
    """
    if not isinstance(deltas, torch.Tensor):
        deltas = torch.as_tensor(deltas, dtype=torch.int64)
    if deltas.is_floating_point() or deltas.is_complex() or deltas.dtype == torch.bool:
        raise ValueError(f"deltas must be an integer tensor, got {deltas.dtype}")
    if not isinstance(inv_freq, torch.Tensor):
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64)
    if not inv_freq.is_floating_point():
        raise ValueError(f"inv_freq must be a floating tensor, got {inv_freq.dtype}")
    if inv_freq.dim() != 1 or inv_freq.numel() == 0:
        raise ValueError(f"inv_freq must be 1-D and non-empty, got shape {tuple(inv_freq.shape)}")
    if device is None:
        device = deltas.device

    d_host = deltas.detach().reshape(-1).to("cpu", torch.int64)
    f_host = inv_freq.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(f_host).all()):
        raise ValueError("inv_freq must be finite")

    uniq, inverse = torch.unique(d_host, sorted=True, return_inverse=True)
    # |delta| < 2**53 converts to float64 exactly; the product rounds once.
    angles = uniq.to(torch.float64)[:, None] * f_host[None, :]
    cos = torch.cos(angles).to(torch.float32)
    sin = torch.sin(angles).to(torch.float32)
    return (
        inverse.to(device=device, dtype=torch.int64),
        cos.to(device).contiguous(),
        sin.to(device).contiguous(),
    )
