"""The runtime's tokenizer and chat template as Hugging Face tokenizer files.

What transformers' ``AutoTokenizer`` and vLLM load next to a checkpoint: the
byte-level BPE ``tokenizer.json`` and a ``tokenizer_config.json`` whose Jinja
chat template renders a message list exactly as :mod:`.chat_template` does
(``<|role|>`` + body + ``<|end|>``; a tool result's ``[name] `` prefix). Tool
calls are part of an assistant message's body text in this format (Leyline's
vLLM plugin and the bench's plain-vLLM client put them there), so a model
trained here sees the same token ids whichever engine serves it. Written by
the benches' random checkpoints and by ``leyline-train --arch llama``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from leyline_runtime.text.chat_template import END, END_OF_TEXT, PAD

# Renders like chat_template.render_message for every message (the body is the message's content,
# tool calls included as text); the generation prompt is the assistant header.
HF_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' }}"
    "{% if m['role'] == 'tool' and m.get('name') %}{{ '[' + m['name'] + '] ' }}{% endif %}"
    "{{ m['content'] if m['content'] is string else '' }}"
    "{{ '" + END + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def special_token_ids(tokenizer_file: str | Path) -> dict[str, int]:
    """The tokenizer's added (special) tokens by text."""
    vocab = json.loads(Path(tokenizer_file).read_text())
    return {t["content"]: t["id"] for t in vocab["added_tokens"]}


def vocab_size(tokenizer_file: str | Path) -> int:
    """One more than the largest id of the vocabulary and the added tokens."""
    vocab = json.loads(Path(tokenizer_file).read_text())
    return max(max(vocab["model"]["vocab"].values()), max(special_token_ids(tokenizer_file).values())) + 1


def config_token_ids(tokenizer_file: str | Path) -> dict[str, int]:
    """The ids a model config names: ``bos_token_id``, ``eos_token_id`` (the end marker), ``pad_token_id``."""
    ids = special_token_ids(tokenizer_file)
    return {"bos_token_id": ids[END_OF_TEXT], "eos_token_id": ids[END], "pad_token_id": ids[PAD]}


def write_tokenizer_files(folder: str | Path, tokenizer_file: str | Path, max_positions: int) -> None:
    """Copy ``tokenizer_file`` into ``folder`` with a ``tokenizer_config.json`` carrying the chat template."""
    folder = Path(folder)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": HF_CHAT_TEMPLATE,
        "bos_token": END_OF_TEXT,
        "eos_token": END,
        "pad_token": PAD,
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
