"""``leyline-train train --arch llama``: a GQA Llama of the default model's size, trained by the same loop,
saved as a folder transformers loads with the runtime's chat template."""

from __future__ import annotations

import json

import pytest
import torch

from leyline_runtime.model import load_model
from leyline_runtime.text.tokenizer import ChatTokenizer
from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_sdk.protocol import Message
from leyline_training.architectures import (
    config_dict, folder_arch, from_config_dict, load_trained, new_model, save_trained,
)
from leyline_training.corpus import DataMix
from leyline_training.train import DEFAULT_TOKENIZER, train


def test_llama_matches_the_default_models_size_and_shape():
    tok = ChatTokenizer.from_file(DEFAULT_TOKENIZER)
    llama = new_model("llama", tok.vocab_size, DEFAULT_TOKENIZER, seed=0)
    mla = new_model("mla", tok.vocab_size, DEFAULT_TOKENIZER, seed=0)
    cfg = llama.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (384, 6, 6, 2)
    n_llama = sum(p.numel() for p in llama.parameters())
    n_mla = sum(p.numel() for p in mla.parameters())
    assert abs(n_llama - n_mla) / n_mla < 0.05
    ids = torch.arange(12)[None]
    assert llama(ids).shape == (1, 12, tok.vocab_size)


def test_llama_from_its_config_is_seeded_like_new_and_saving_leaves_the_model_as_it_was(tmp_path):
    tok = ChatTokenizer.from_file(DEFAULT_TOKENIZER)
    llama = new_model("llama", tok.vocab_size, DEFAULT_TOKENIZER, seed=3)
    again = from_config_dict("llama", config_dict(llama), seed=3)  # evaluate's random-init baseline
    assert all(torch.equal(a, b) for a, b in zip(llama.state_dict().values(), again.state_dict().values()))
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    save_trained(llama, tmp_path / "model", DEFAULT_TOKENIZER)
    assert all(v.dtype == torch.float32 and torch.equal(v, before[k]) for k, v in llama.state_dict().items())
    loaded = load_trained(tmp_path / "model").state_dict()  # stored in bf16
    assert all(torch.equal(loaded[k], v.to(torch.bfloat16).float()) for k, v in before.items())


def test_train_llama_writes_a_folder_transformers_and_its_chat_template_load(tmp_path):
    mix = DataMix(token_echo_share=1.0, transcript_share=1.0)
    out = train(tmp_path / "run", minutes=5, seq_len=256, batch=2, curriculum="", max_steps=2, log_every=1,
                eval_transcripts=0, rows_per_shard=4, mix=mix, arch="llama", threads=1, log=lambda *_: None)
    folder = tmp_path / "run" / "model"
    assert folder_arch(folder) == "llama" and out["steps"] == 2
    model = load_trained(folder)
    from transformers import AutoTokenizer, LlamaForCausalLM

    assert isinstance(model.hf, LlamaForCausalLM)
    hf_tok = AutoTokenizer.from_pretrained(folder)
    tok = ChatTokenizer.from_file(folder / "tokenizer.json")
    messages = [Message(role="user", content="list the files"), Message(role="tool", name="ls", content="a.py")]
    ours = [t for m in tok.encode_messages(messages) for t in m] + [tok.role_ids["assistant"]]
    theirs = hf_tok.apply_chat_template([m.model_dump(exclude_none=True) for m in messages],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(theirs) == ours
    assert json.loads((folder / "config.json").read_text())["num_key_value_heads"] == 2


def test_init_from_refuses_the_other_architecture(tmp_path):
    with pytest.raises(ValueError, match="holds a mla model"):
        train(tmp_path / "run", minutes=1, seq_len=256, batch=1, curriculum="", max_steps=1, eval_transcripts=0,
              init_from=DEFAULT_MODEL_DIR, arch="llama", threads=1, log=lambda *_: None)
    assert load_model(str(DEFAULT_MODEL_DIR)) is not None


def test_evaluate_scores_a_llama_folder_and_refuses_the_runtime_tasks_by_name(tmp_path):
    import argparse

    from leyline_training.cli import add_evaluate_arguments
    from leyline_training.evaluate import run

    train(tmp_path / "run", minutes=5, seq_len=256, batch=1, curriculum="", max_steps=1, eval_transcripts=0,
          rows_per_shard=2, mix=DataMix(token_echo_share=1.0, transcript_share=1.0), arch="llama", threads=1,
          log=lambda *_: None)
    ap = argparse.ArgumentParser()
    add_evaluate_arguments(ap)
    folder = str(tmp_path / "run" / "model")
    result = run(ap.parse_args(["--model", folder, "--tasks", "0", "--ppl-transcripts", "2"]))
    assert result["perplexity"]["trained"]["loss"] > 0
    with pytest.raises(SystemExit, match="serves MLA models only"):
        run(ap.parse_args(["--model", folder, "--tasks", "1", "--ppl-transcripts", "0"]))
