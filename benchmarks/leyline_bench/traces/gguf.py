"""A random Qwen3 checkpoint of :mod:`..vllm.tiny_models` as a GGUF file that ``llama-server`` loads.

The random checkpoints carry the bundled runtime's byte-level BPE tokenizer, which llama.cpp's
``convert_hf_to_gguf.py`` refuses (it recognises pre-tokenizers by the hash of their output on a
fixed text). The replay sends llama.cpp token ids, never text, so the tokenizer only has to load:
this writes the vocabulary as a ``gpt2`` BPE with the ``default`` pre-tokenizer, and the weights
as they are (F32) under llama.cpp's ``qwen3`` tensor names (Qwen3 rotates with NeoX pairing in both
transformers and llama.cpp: no rows are permuted, as the converter permutes none for Qwen).
"""

from __future__ import annotations

import json
from pathlib import Path

# transformers' Qwen3ForCausalLM names -> llama.cpp's (``{i}`` the layer)
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
GGUF_NAME = "model-f32.gguf"


def gguf_name(hf_name: str) -> str:
    if hf_name in MODEL_TENSORS:
        return MODEL_TENSORS[hf_name]
    prefix, layer, rest = hf_name.split(".", 3)[1], hf_name.split(".")[2], hf_name.split(".", 3)[3]
    if prefix != "layers" or rest not in LAYER_TENSORS:
        raise ValueError(f"no llama.cpp name for {hf_name}")
    return f"blk.{int(layer)}.{LAYER_TENSORS[rest]}"


def write_qwen3_gguf(checkpoint: Path, out: Path | None = None) -> Path:
    """``checkpoint`` (a ``make_tiny_checkpoint(..., "qwen3", ...)`` folder) as ``out`` (default: beside it)."""
    import gguf
    from safetensors import safe_open

    checkpoint = Path(checkpoint)
    out = Path(out) if out else checkpoint / GGUF_NAME
    if out.is_file():
        return out
    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        raise ValueError(f"{checkpoint}: a qwen3 checkpoint is needed, not {config.get('model_type')!r}")
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), "qwen3")
    _hyperparameters(writer, config)
    _vocabulary(writer, checkpoint / "tokenizer.json", config)
    with safe_open(str(checkpoint / "model.safetensors"), framework="numpy") as weights:
        for name in weights.keys():
            writer.add_tensor(gguf_name(name), weights.get_tensor(name).astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(out)
    return out


def _hyperparameters(writer, config: dict) -> None:
    import gguf

    rope = config.get("rope_parameters") or {}
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 1_000_000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def _vocabulary(writer, tokenizer_json: Path, config: dict) -> None:
    import gguf

    spec = json.loads(tokenizer_json.read_text())
    n_vocab = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for text, i in spec["model"]["vocab"].items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in spec.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])
