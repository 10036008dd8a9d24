"""Leyline kernels: rotate-and-splice of KV-cache rows.

Moving a cached token from position ``p`` to ``p + delta`` copies its
position-free columns bit for bit and rotates its rope slice by
``delta * inv_freq`` (RoPE rotations compose).  ``delta_rotation_table``
builds the per-delta cos/sin table on the host in float64;
``rotate_and_splice`` applies it with the Triton kernel (CUDA) or the torch
path (CPU), see ``kernel_backend``.  The rope slice's pair layout is a
parameter: half-split (the bundled runtime) or interleaved (vLLM's cache).

Imports torch and (lazily) triton only.
"""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as exc:  # name the extra instead of a bare "No module named 'torch'"
    raise ModuleNotFoundError(
        "leyline_kernels needs the 'runtime' extra (torch is not installed): from a checkout of the repository, "
        "pip install -e '.[runtime]' (leyline-kv is on no package index)",
        name=exc.name,
    ) from exc

from .dispatch import kernel_backend, rotate_and_splice
from .rope_table import delta_rotation_table
from .rotate_and_splice_torch import rotate_and_splice_torch
from .rotate_and_splice_triton import rotate_and_splice_triton

__all__ = [
    "delta_rotation_table",
    "kernel_backend",
    "rotate_and_splice",
    "rotate_and_splice_torch",
    "rotate_and_splice_triton",
]
