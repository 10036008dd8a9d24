"""The peer: the same checkpoint run by transformers, as a user without Leyline would.

After an edit such a user has two options: prefill the edited history from
scratch, or crop the ``DynamicCache`` of the old history at the first token
that changed and prefill the rest. The edit bench times both and reports the
better one.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch

from leyline_runtime.model import DeepseekForCausalLM, save_model
from leyline_runtime.model.default import DEFAULT_MODEL_DIR


def checkpoint_folder(model_path: str | None, model: DeepseekForCausalLM, scratch: str) -> Path:
    """An HF-style folder holding the runtime's weights (the seeded default model is saved first)."""
    if model_path:
        return Path(model_path)
    if (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        return DEFAULT_MODEL_DIR
    folder = Path(scratch) / "default_model"
    save_model(model, folder)
    return folder


class TransformersPeer:
    def __init__(self, folder: str | Path, dtype: torch.dtype = torch.float32, **config_overrides):
        from transformers import DeepseekV3ForCausalLM

        self.model = DeepseekV3ForCausalLM.from_pretrained(str(folder), dtype=dtype, **config_overrides).eval()

    @torch.no_grad()
    def prefill(self, ids: list[int], cache=None):
        """Run ``ids`` after what ``cache`` holds (a fresh cache when None); returns the cache."""
        from transformers import DynamicCache

        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        self.model(torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
        return cache

    def crop_and_prefill(self, cache, ids: list[int], keep: int):
        """Crop ``cache`` (in place) to its first ``keep`` tokens, then prefill ``ids[keep:]``."""
        drop = cache.get_seq_length() - keep
        if drop > 0:
            cache.crop(-drop)
        return self.prefill(ids[keep:], cache) if keep < len(ids) else cache

    @staticmethod
    def copy_cache(cache):
        return copy.deepcopy(cache)


def scratch_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="leyline-bench-")
