"""leyline_vllm.kv.rope against vLLM's own rotary objects (no server) and transformers' RoPE as the fp64 oracle.

For each scaling vLLM builds with ``get_rope``, the inverse frequencies Leyline reads must equal what
transformers computes for the same parameters (in float64), and must reproduce the object's own cos/sin
table; what is not a fixed per-position rotation is refused by name.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm`")

from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: E402

from leyline_vllm.kv.rope import UnsupportedModel, rope_spec  # noqa: E402

HEAD, MAX_POS = 64, 4096


@pytest.fixture(autouse=True)
def vllm_config():
    """vLLM's custom ops (the rotary objects) are built inside a current config, as in a model load."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield

SCALINGS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
}


def vllm_rope(params: dict, *, neox: bool = True, partial: float = 1.0, max_pos: int = MAX_POS):
    full = dict(params, partial_rotary_factor=partial) if partial != 1.0 else dict(params)
    return get_rope(HEAD, max_position=max_pos, is_neox_style=neox, rope_parameters=full, dtype=torch.float32)


def transformers_inv_freq(params: dict, partial: float = 1.0) -> torch.Tensor:
    config = LlamaConfig(hidden_size=HEAD * 4, num_attention_heads=4, head_dim=HEAD, max_position_embeddings=MAX_POS,
                         rope_parameters=dict(params, partial_rotary_factor=partial))
    kind = params["rope_type"]
    if kind == "default":
        dim = int(HEAD * partial)
        return 1.0 / params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.to(torch.float64)


@pytest.mark.parametrize("name", sorted(SCALINGS))
@pytest.mark.parametrize("neox", [True, False])
def test_inverse_frequencies_equal_transformers(name, neox):
    spec = rope_spec([vllm_rope(SCALINGS[name], neox=neox)])
    assert spec.pair_layout == ("half_split" if neox else "interleaved") and spec.rotary_dim == HEAD
    want = transformers_inv_freq(SCALINGS[name])
    assert torch.allclose(spec.inv_freq, want, rtol=1e-6, atol=0), (spec.inv_freq - want).abs().max()
    assert spec.inv_freq.dtype == torch.float64


def test_partial_rotary_reads_the_rotated_width():
    spec = rope_spec([vllm_rope(SCALINGS["default"], neox=False, partial=0.5)])
    assert spec.rotary_dim == HEAD // 2 and spec.inv_freq.numel() == HEAD // 4
    assert torch.allclose(spec.inv_freq, transformers_inv_freq(SCALINGS["default"], 0.5), rtol=1e-6, atol=0)


def test_dynamic_ntk_as_vllm_fixes_it_reproduces_its_table():
    rope = vllm_rope({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, max_pos=2048)
    spec = rope_spec([rope])  # the check against the cos/sin table passed inside
    assert spec.kind == "DynamicNTKScalingRotaryEmbedding"
    p = 1000
    angle = p * spec.inv_freq
    assert torch.allclose(rope.cos_sin_cache[p, :HEAD // 2].double(), torch.cos(angle), atol=1e-4)


def test_a_formula_that_does_not_reproduce_the_table_is_refused():
    rope = vllm_rope({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    rope.scaling_factors = [1.0]  # Leyline would read unscaled frequencies; the table says otherwise
    with pytest.raises(UnsupportedModel, match="do not reproduce"):
        rope_spec([rope])


def test_m_rope_and_longrope_are_refused_by_name():
    mrope = vllm_rope({"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]})
    with pytest.raises(UnsupportedModel, match="M-RoPE"):
        rope_spec([mrope])
    from vllm.model_executor.layers.rotary_embedding.phi3_long_rope_scaled_rope import (
        Phi3LongRoPEScaledRotaryEmbedding,
    )

    # refused by its class before anything of it is read (building one needs a whole model config)
    longrope = Phi3LongRoPEScaledRotaryEmbedding.__new__(Phi3LongRoPEScaledRotaryEmbedding)
    with pytest.raises(UnsupportedModel, match="LongRoPE"):
        rope_spec([longrope])


def test_several_different_rotations_or_none_are_refused():
    with pytest.raises(UnsupportedModel, match="different rotary"):
        rope_spec([vllm_rope(SCALINGS["default"]), vllm_rope(SCALINGS["yarn"])])
    with pytest.raises(UnsupportedModel, match="no rotary"):
        rope_spec([])
    same = vllm_rope(SCALINGS["default"])
    assert rope_spec([same, same]).rotary_dim == HEAD


def test_yarn_scale_is_not_read_as_frequency():
    rope = vllm_rope(SCALINGS["yarn"])
    assert not math.isclose(float(rope.cos_sin_cache[0, 0]), 1.0)  # YaRN's mscale is in vLLM's table
    assert rope_spec([rope]).kind == "YaRNScalingRotaryEmbedding"
