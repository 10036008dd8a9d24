"""A GGUF checkpoint into a Hugging Face bf16 folder, with transformers' own GGUF loader.

The folder holds ``model.safetensors``, ``config.json``, ``generation_config.json`` and the
tokenizer files (the tokenizer and its chat template come out of the GGUF too), so both
``AutoModelForCausalLM.from_pretrained(folder)`` and ``vllm serve <folder>`` load it without the
GGUF. The weights are the GGUF's dequantized: Q4_K_M blocks unpacked to bf16, nothing re-trained.

transformers keeps a GGUF's weights packed in their blocks when it has a matmul kernel for them
(5.25 looks one up through Hugging Face's ``kernels``); packed weights cannot be saved as a plain
checkpoint, so the loader is told ``GgufConfig(dequantize=True)``, and every parameter is checked
to be a dense bf16 tensor before anything is written.

A folder is reused when its marker file names the GGUF's sha256; a folder is written under
``<folder>.partial`` and renamed when complete, so a conversion cut short is never mistaken for one.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path

from leyline_runtime.extras import MissingExtra

log = logging.getLogger(__name__)
MARKER = "leyline-weights.json"


class ConversionError(RuntimeError):
    """transformers loaded the GGUF into something that is not a plain dense bf16 model."""


def is_converted(folder: Path, gguf_sha256: str) -> bool:
    marker = folder / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("gguf_sha256") == gguf_sha256


def convert_gguf(gguf: Path, folder: Path, gguf_sha256: str) -> Path:
    """``folder`` converted from ``gguf`` (whose checked sha256 is ``gguf_sha256``); reused when already done."""
    if is_converted(folder, gguf_sha256):
        return folder
    # Imported here, not at the top: listing the catalog and reusing a converted folder need neither torch
    # nor transformers, and a venv without gguf/accelerate (vLLM's) can still use a warm cache.
    for module in ("gguf", "accelerate"):  # transformers' own errors for these name no extra
        if importlib.util.find_spec(module) is None:
            raise MissingExtra("bench", module, f"converting {gguf.name}")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.perf_counter()
    log.info("converting %s to bf16 safetensors with transformers %s", gguf.name, transformers.__version__)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    not_dense = [name for name, p in model.named_parameters()
                 if type(p.data) is not torch.Tensor or p.dtype != torch.bfloat16]
    if not_dense or getattr(model.config, "quantization_config", None) is not None:
        raise ConversionError(f"{gguf.name}: transformers {transformers.__version__} did not unpack every weight "
                              f"to dense bf16 ({', '.join(not_dense[:3]) or 'a quantization_config is left'})")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    seconds = round(time.perf_counter() - started, 1)
    (partial / MARKER).write_text(json.dumps({
        "gguf": gguf.name, "gguf_sha256": gguf_sha256, "transformers": transformers.__version__,
        "seconds": seconds}, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    log.info("converted %s in %.1f s", gguf.name, seconds)
    return folder
