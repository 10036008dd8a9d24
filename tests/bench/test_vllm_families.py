"""The tiny checkpoints of ``leyline_testkit.tiny_models.FAMILIES``: each is written, loads in
transformers, and its layer-0 keys rotate the way the family claims (pairing, rotary
slice, frequencies and scaling), checked against an fp64 reference written here.

The check needs no access to the model's code: fed one token repeated, layer 0 sees the
same pre-rope key at every position, so the cached key at position p must be the cached
key at position 0 rotated by p times each pair's frequency, and the dims outside the
rotary slice must not move.
"""

import json
import math

import pytest
import torch
from server_support import torch_threads

from leyline_testkit.tiny_models import FAMILIES, MARKER, make_tiny_checkpoint, make_tiny_mla_checkpoint

POSITIONS = 8


def default_freqs(base: float, dim: int) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def llama3_freqs(base, dim, factor, low_freq_factor, high_freq_factor, original):
    freqs = default_freqs(base, dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    return torch.where(wavelen > original / low_freq_factor, freqs / factor,
                       torch.where(wavelen < original / high_freq_factor, freqs, blended))


def yarn_freqs(base, dim, factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN (Peng et al. 2023): full interpolation below beta_slow turns over the original
    context, none above beta_fast, linear in between (its ends rounded out to whole dims
    when ``truncate``, as transformers and vLLM do by default)."""
    def correction_dim(turns):
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    freqs = default_freqs(base, dim)
    return freqs / factor * ramp + freqs * (1 - ramp)


# family: (kv heads, head dim, rotary slice (start, width), pairing, frequencies). deepseek_v2 is
# not here: transformers caches its MLA latent and rope key apart (tests/vllm splices it).
CLAIMS = {
    "llama3": (2, 64, (0, 64), "neox", llama3_freqs(500000.0, 64, 8.0, 1.0, 4.0, 1024)),
    "llama_linear": (2, 64, (0, 64), "neox", default_freqs(10000.0, 64) / 2.0),
    "qwen2": (2, 64, (0, 64), "neox", default_freqs(1e6, 64)),
    "qwen3": (2, 128, (0, 128), "neox", default_freqs(1e6, 128)),
    "qwen3_yarn": (2, 128, (0, 128), "neox", yarn_freqs(1e6, 128, 4.0, 1024)),
    "mistral": (2, 64, (0, 64), "neox", default_freqs(1e6, 64)),
    "glm4": (2, 64, (0, 32), "gptj", default_freqs(10000.0, 32)),
    "gptj": (4, 64, (0, 64), "gptj", default_freqs(10000.0, 64)),
    "cohere": (2, 64, (0, 64), "gptj", default_freqs(10000.0, 64)),
    "gpt_oss": (2, 64, (0, 64), "neox", yarn_freqs(150000.0, 64, 4.0, 1024, truncate=False)),
}


def rotate(keys: torch.Tensor, angles: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate each pair of ``keys[..., :2*len(angles)]`` by ``angles``; NeoX pairs (i, i + half),
    GPT-J pairs (2i, 2i + 1)."""
    half = angles.shape[-1]
    if pairing == "neox":
        x1, x2 = keys[..., :half], keys[..., half:]
    else:
        x1, x2 = keys[..., 0::2], keys[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return torch.cat([y1, y2], -1) if pairing == "neox" else torch.stack([y1, y2], -1).flatten(-2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    with torch_threads(1):
        return {name: make_tiny_checkpoint(root / name, name) for name in FAMILIES}


# Hybrid attention/recurrent: its layer 0 is a Gated DeltaNet layer (no keys); tests/vllm checks the refusal.
HYBRID = {"qwen3_next"}


def test_claims_cover_every_gqa_family():
    assert set(CLAIMS) == set(FAMILIES) - {"deepseek_v2"} - HYBRID


@pytest.mark.parametrize("family", sorted(CLAIMS))
def test_layer0_keys_rotate_as_the_family_claims(checkpoints, family):
    import transformers

    kv_heads, head_dim, (start, width), pairing, freqs = CLAIMS[family]
    with torch_threads(1):
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[family], dtype=torch.float32).eval()
        with torch.no_grad():
            out = model(torch.full((1, POSITIONS), 300), use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]  # renamed in transformers 5.2x
    keys = cache.layers[0].keys[0].double()  # [kv_heads, positions, head_dim]
    assert keys.shape == (kv_heads, POSITIONS, head_dim)
    rotary, first = keys[..., start:start + width], keys[:, :1, start:start + width]
    angles = torch.arange(POSITIONS, dtype=torch.float64)[:, None] * freqs  # [positions, width / 2]
    expected = rotate(first, angles, pairing)
    assert (rotary - expected).abs().amax() <= 2e-5 * keys.abs().amax()
    other = "gptj" if pairing == "neox" else "neox"  # the wrong pairing would be seen
    assert (rotary - rotate(first, angles, other)).abs().amax() > 1e-2 * keys.abs().amax()
    outside = torch.cat([keys[..., :start], keys[..., start + width:]], -1)
    assert torch.equal(outside, outside[:, :1].expand_as(outside))  # non-rotary dims do not move


def test_family_specific_structure(checkpoints):
    import transformers

    def config(name):
        return transformers.AutoConfig.from_pretrained(checkpoints[name])

    assert config("llama3").rope_parameters["rope_type"] == "llama3"
    assert config("qwen3_yarn").rope_parameters["rope_type"] == "yarn"
    assert config("mistral").sliding_window is None
    oss = config("gpt_oss")
    assert oss.layer_types == ["sliding_attention", "full_attention"] and oss.sliding_window == 128
    assert oss.rms_norm_eps == 1e-5  # vLLM's GptOss ignores the config's eps and uses 1e-5
    assert config("cohere").tie_word_embeddings  # vLLM's Cohere has no LM head of its own
    assert config("qwen3_next").layer_types == ["linear_attention", "full_attention"]
    with torch_threads(1):
        qwen2 = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["qwen2"]).model.layers[0].self_attn
        qwen3 = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["qwen3"]).model.layers[0].self_attn
        oss_attn = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["gpt_oss"]).model.layers[0].self_attn
    assert qwen2.k_proj.bias is not None and qwen2.q_proj.bias is not None
    assert qwen3.k_norm.weight.shape == (128,) and qwen3.q_norm.weight.shape == (128,)
    assert oss_attn.sinks.shape == (8,)


def test_checkpoint_is_rewritten_only_when_its_arguments_change(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "q", "qwen3")
    stamp = json.loads((folder / MARKER).read_text())
    assert stamp["family"] == "qwen3"
    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    make_tiny_checkpoint(folder, "qwen3")
    assert weights.stat().st_mtime_ns == written
    make_tiny_checkpoint(folder, "qwen3", seed=1)
    assert weights.stat().st_mtime_ns != written
    assert json.loads((folder / MARKER).read_text())["seed"] == 1


def test_mla_checkpoint_is_the_deepseek_v2_family(tmp_path):
    folder = make_tiny_mla_checkpoint(tmp_path / "mla")
    assert json.loads((folder / MARKER).read_text())["family"] == "deepseek_v2"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|end|>" and "<|assistant|>" in tokenizer_config["chat_template"]


def test_unknown_family_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown family 'falcon'.*qwen3"):
        make_tiny_checkpoint(tmp_path / "x", "falcon")
    assert not (tmp_path / "x").exists()
