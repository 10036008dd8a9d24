"""The model architectures ``leyline-train train --arch`` builds, at the default model's size.

* ``mla`` (default): the bundled runtime's own model, DeepSeek-V3 MLA
  (``leyline_runtime.model.default_config``), saved in its Hugging Face
  DeepSeek layout; the runtime serves it.
* ``llama``: a Llama-architecture GQA model of the same width, depth, heads and
  MLP (hidden 384, 6 layers, 6 query heads of 64 over 2 KV heads, NeoX rotary
  on every dim, MLP 1024, tied embeddings: 12.5M parameters against MLA's
  12.8M), built with transformers' ``LlamaForCausalLM``. The bundled runtime
  is MLA only; a trained ``llama`` folder carries the Hugging Face tokenizer
  files and the chat template, so vLLM (with Leyline's plugin) and
  transformers serve it. It exists to measure whether amortize drifts on GQA
  as it does on MLA (``leyline-bench drift``).

Both are initialised the same way (seeded N(0, 0.02) for every matrix, unit
norms) and trained by the same loop on the same data.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from leyline_runtime.model import default_config, load_model, save_model, seeded_model
from leyline_runtime.model.config import config_from_dict
from leyline_runtime.text.hf_files import config_token_ids, write_tokenizer_files
from .cli import ARCHITECTURES

MAX_POSITIONS = 4096


class HFCausalLM(torch.nn.Module):
    """A transformers causal LM called the way the trainer calls the runtime's model: ids -> logits."""

    def __init__(self, hf: torch.nn.Module):
        super().__init__()
        self.hf = hf
        self.config = hf.config

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=ids, use_cache=False).logits


def llama_config(vocab_size: int, tokenizer_file: str | Path):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=64, max_position_embeddings=MAX_POSITIONS,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                       **config_token_ids(tokenizer_file))


def _seed_parameters(model: torch.nn.Module, seed: int) -> None:
    """N(0, 0.02) for every matrix in name order from one generator, norms at one (``seeded_model``'s rule)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.fill_(1.0)


def new_model(arch: str, vocab_size: int, tokenizer_file: str | Path, seed: int) -> torch.nn.Module:
    """A seeded, untrained model of ``arch``."""
    if arch == "mla":
        return seeded_model(default_config(vocab_size), seed)
    if arch == "llama":
        from transformers import LlamaForCausalLM

        model = HFCausalLM(LlamaForCausalLM(llama_config(vocab_size, tokenizer_file)).to(torch.float32))
        _seed_parameters(model, seed)
        return model.eval()
    raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHITECTURES)}")


def arch_of(model: torch.nn.Module) -> str:
    return "llama" if isinstance(model, HFCausalLM) else "mla"


def config_dict(model: torch.nn.Module) -> dict:
    """The model's config as the checkpoint and training.json store it."""
    return model.config.to_dict() if isinstance(model, HFCausalLM) else model.config.to_hf_dict()


def from_config_dict(arch: str, config: dict, seed: int) -> torch.nn.Module:
    """A model of a checkpoint's stored config, seeded by ``new_model``'s rule (the random-init baseline of
    ``leyline-train evaluate``; a resumed run loads its weights over it)."""
    if arch == "mla":
        return seeded_model(config_from_dict(config), seed)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_dict({k: v for k, v in config.items() if k != "transformers_version"})
    model = HFCausalLM(LlamaForCausalLM(cfg).to(torch.float32))
    _seed_parameters(model, seed)
    return model


def folder_arch(folder: str | Path) -> str:
    """``llama`` for a folder this module saved a Llama model in, else ``mla``."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return "llama" if config.get("model_type") == "llama" else "mla"


def load_trained(folder: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A saved model folder of either architecture, in ``dtype``, in eval mode."""
    if folder_arch(folder) == "mla":
        return load_model(str(folder), dtype=dtype)
    from transformers import LlamaForCausalLM

    return HFCausalLM(LlamaForCausalLM.from_pretrained(str(folder), dtype=dtype)).eval()


def save_trained(model: torch.nn.Module, folder: str | Path, tokenizer_file: str | Path) -> None:
    """Weights in bf16 (half the bytes; loaders upcast), config and tokenizer; a Llama folder also gets the
    Hugging Face tokenizer config with the chat template, so vLLM and transformers load it as it is."""
    folder = Path(folder)
    if isinstance(model, HFCausalLM):
        # a bf16 copy: casting the model itself would round the weights the caller goes on using
        copy.deepcopy(model.hf).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        write_tokenizer_files(folder, tokenizer_file, MAX_POSITIONS)
        return
    save_model(model, folder, dtype=torch.bfloat16)
    (folder / "tokenizer.json").write_bytes(Path(tokenizer_file).read_bytes())
