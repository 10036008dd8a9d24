"""The model on its own: a plain causal forward of the embedded default model (needs the runtime extra)."""

import torch

from leyline_runtime import load_model

model = load_model()  # the embedded default; load_model("path/to/folder") for a Hugging Face checkpoint
input_ids = torch.tensor([[1, 2, 3, 4]])
with torch.no_grad():
    logits = model(input_ids)  # [B, T] -> [B, T, vocab]
print(tuple(logits.shape))
