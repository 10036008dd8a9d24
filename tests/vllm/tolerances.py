"""How far a vLLM test lets two sets of numbers differ, by the dtype vLLM serves: the one table every test
of this folder reads (``TOLERANCE[server.dtype]``).

Row tolerances are over the reference rows' largest magnitude. ``rotary``: a moved row's rope dims
against a fresh prefill's at layer 0, where a row depends only on its token and position. fp32: float
error of the rotation. bf16: a stored row is rounded before and after its rotation, and vLLM's fresh
prefill rotates with its own bf16 cos/sin cache, so up to a few bf16 ulps of the largest value (measured:
7.0e-3 qwen3, 1.03e-2 glm4 on the CPU backend without AMX; 1.22e-2 on the MLA test model with AMX, whose
rows mix the rope and latent dims). ``other``: the dims copied unchanged (V, latent c_kv, non-rotary K).
``prefill_row``: two honest prefills of one history in other batch shapes, every layer. ``logprob``: a
generated token's logprob against vLLM's own fresh prefill. ``cross_engine_logprob``: the bundled runtime
(fp32) against vLLM serving the same weights in this dtype; bf16 rounds each logit to 2^-8 of its size
(the tiny test models' logits reach ~10) and the log-softmax adds as much again (measured on the AMX
Xeon: 0.058 on the first token, 0.080 at the fifth).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rotary: float
    other: float
    prefill_row: float
    logprob: float
    cross_engine_logprob: float


BF16_ULP = 2.0 ** -8
TOLERANCE = {
    "float32": Tolerance(rotary=1e-4, other=1e-5, prefill_row=1e-4, logprob=2e-2, cross_engine_logprob=2e-2),
    "bfloat16": Tolerance(rotary=4 * BF16_ULP, other=2 * BF16_ULP, prefill_row=4 * BF16_ULP, logprob=5e-2,
                          cross_engine_logprob=32 * BF16_ULP),
}
