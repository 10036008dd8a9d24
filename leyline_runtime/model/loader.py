"""Load and save Hugging Face style model folders.

A folder holds ``config.json`` and ``model.safetensors`` (or a sharded
``model.safetensors.index.json``). Interleaved-rope checkpoints (DeepSeek-V2,
V3 with ``rope_interleave``) get their rope rows reordered evens-then-odds at
load, so the runtime computes and caches ``k_pe`` in one half-split layout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import MLAConfig, UnsupportedConfig, config_from_dict
from .deepseek import DeepseekForCausalLM
from .default import DEFAULT_MODEL_DIR, default_config, default_tokenizer_path, seeded_model

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_FUSED_EXPERTS_RE = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def read_config(folder: str | Path) -> MLAConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    with open(path) as f:
        return config_from_dict(json.load(f))


def load_model(path: str | None = None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> DeepseekForCausalLM:
    """Load a model folder; ``path=None`` loads the embedded default model."""
    if path is None:
        return _load_default_model(device=device, dtype=dtype)
    folder = Path(path)
    cfg = read_config(folder)
    with torch.device("meta"):
        model = DeepseekForCausalLM(cfg)
    state = _read_weights(folder, cfg)
    if cfg.rope_interleave:
        _deinterleave_rope_rows(state, cfg)
    _load_state(model, state, folder)
    return model.to(device=device, dtype=dtype).eval()


def _load_default_model(device: str | torch.device, dtype: torch.dtype) -> DeepseekForCausalLM:
    if (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        return load_model(str(DEFAULT_MODEL_DIR), device=device, dtype=dtype)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(default_tokenizer_path())).get_vocab_size()
    return seeded_model(default_config(vocab)).to(device=device, dtype=dtype)


def save_model(model: DeepseekForCausalLM, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` (transformers style, half-split rope) + ``model.safetensors``.

    ``dtype`` stores the weights in that type (``torch.bfloat16`` halves the file);
    :func:`load_model` casts them to the dtype it is asked for (fp32 upcasts exactly).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg_dict = model.config.to_hf_dict()
    cfg_dict["rope_interleave"] = False  # we store the half-split layout
    with open(folder / "config.json", "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)  # no torch_dtype: readers default to fp32
    state = {k: v.detach().to("cpu", dtype=dtype or v.dtype).contiguous() for k, v in model.state_dict().items()
             if not k.startswith("rotary.")}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _read_weights(folder: Path, cfg: MLAConfig) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {folder}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(folder / name), framework="pt") as f:
            for key in f.keys():
                layer = _LAYER_RE.match(key)
                if layer and int(layer.group(1)) >= cfg.num_hidden_layers:
                    continue  # multi-token-prediction layers
                state[key] = f.get_tensor(key)
    return _split_fused_experts(state)


def _split_fused_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors -> per-expert Linear weights."""
    out = {}
    for key, value in state.items():
        m = _FUSED_EXPERTS_RE.match(key)
        if not m:
            out[key] = value
            continue
        prefix, kind = m.groups()
        for j in range(value.shape[0]):
            if kind == "gate_up_proj":
                gate, up = value[j].chunk(2, dim=0)
                out[f"{prefix}.{j}.gate_proj.weight"] = gate
                out[f"{prefix}.{j}.up_proj.weight"] = up
            else:
                out[f"{prefix}.{j}.down_proj.weight"] = value[j]
    return out


def _evens_then_odds(dim: int) -> torch.Tensor:
    return torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))


def _deinterleave_rope_rows(state: dict[str, torch.Tensor], cfg: MLAConfig) -> None:
    """Reorder rope output rows (2i, 2i+1) -> (i, i + D/2) in q and kv_a projections."""
    rope, nope, H = cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.num_attention_heads
    perm = _evens_then_odds(rope)
    q_rows = torch.arange(H * cfg.qk_head_dim).view(H, cfg.qk_head_dim)
    q_rows[:, nope:] = q_rows[:, nope:][:, perm]
    kv_rows = torch.arange(cfg.kv_lora_rank + rope)
    kv_rows[cfg.kv_lora_rank:] = cfg.kv_lora_rank + perm
    for key in list(state):
        if key.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
            state[key] = state[key][q_rows.flatten()]
        elif key.endswith(("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_proj_with_mqa.bias")):
            state[key] = state[key][kv_rows]


def _load_state(model: DeepseekForCausalLM, state: dict[str, torch.Tensor], folder: Path) -> None:
    expected = {k for k in model.state_dict() if not k.startswith("rotary.")}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    missing = sorted(expected - state.keys())
    if missing:
        raise UnsupportedConfig(f"checkpoint {folder} lacks weights: {missing[:5]}"
                                + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    unexpected = sorted(k for k in state.keys() - expected if "rotary_emb" not in k)
    if unexpected:
        raise UnsupportedConfig(f"checkpoint {folder} has weights this config does not use: {unexpected[:5]}")
    model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers that are not weights (rope tables) were built on the meta device.
    model.rotary = type(model.rotary)(model.config)
