"""A tiny random DeepSeek-V2 checkpoint that vLLM's CPU MLA backends accept.

vLLM's CPU MLA kernels take only ``kv_lora_rank + qk_rope_head_dim = 512 + 64``,
so the latent and rope widths are DeepSeek's own; everything else is small
(hidden 256, 2 dense layers, 8 heads). Weights are random (seeded) and saved
with transformers; the tokenizer is the bundled runtime's byte-level BPE, with a
chat template that renders exactly like the runtime's own template
(``<|role|>`` + body + ``<|end|>``), so both engines see the same token ids for
plain text messages. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Renders like leyline_runtime.text.chat_template for messages without tools:
# every message is header + content + end marker; the generation prompt is the
# assistant header.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' }}"
    "{% if m['role'] == 'tool' and m.get('name') %}{{ '[' + m['name'] + '] ' }}{% endif %}"
    "{{ m['content'] if m['content'] is string else '' }}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

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


def runtime_tokenizer_file() -> Path:
    import leyline_runtime

    return Path(leyline_runtime.__file__).parent / "default_model" / "tokenizer.json"


def make_tiny_mla_checkpoint(folder: str | Path, *, seed: int = 0, max_positions: int = 4096,
                             init_std: float = 0.08) -> Path:
    """Write config, safetensors weights, tokenizer and chat template into ``folder``
    (skipped when ``folder`` already holds a checkpoint made with the same arguments)."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    folder = Path(folder)
    stamp = {"seed": seed, "max_positions": max_positions, "init_std": init_std, "shape": SHAPE}
    marker = folder / "leyline_tiny_mla.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    vocab = json.loads(runtime_tokenizer_file().read_text())
    specials = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    vocab_size = max(max(vocab["model"]["vocab"].values()), max(specials.values())) + 1
    config = DeepseekV2Config(
        vocab_size=vocab_size, max_position_embeddings=max_positions, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=init_std, tie_word_embeddings=False,
        bos_token_id=specials["<|endoftext|>"], eos_token_id=specials["<|end|>"],
        pad_token_id=specials["<|pad|>"], **SHAPE,
    )
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(runtime_tokenizer_file(), folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|end|>",
        "pad_token": "<|pad|>",
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    marker.write_text(json.dumps(stamp))
    return folder
