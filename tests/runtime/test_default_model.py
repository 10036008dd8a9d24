"""The shipped default model: trained weights, real tool calls, far below random loss."""

import json

import pytest

from leyline_sdk.protocol import GenerateRequest, SessionCreate
from leyline_runtime.model import DEFAULT_MODEL_DIR, seeded_model
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.text.tokenizer import ChatTokenizer
from leyline_training.evaluate import heldout_loss
from leyline_training.tools import validate_call
from leyline_training.transcripts import make_task

HELD_OUT_TASKS = [0, 1, 2, 3]  # test-split seeds: entities the model never saw in training


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=16384))


def test_default_model_is_the_trained_checkpoint():
    assert (DEFAULT_MODEL_DIR / "model.safetensors").is_file()
    cfg = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3" and cfg["max_position_embeddings"] >= 2048
    size = sum(p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir())
    assert size < 60 * 2**20


@pytest.mark.parametrize("seed", HELD_OUT_TASKS)
def test_greedy_first_turn_is_a_well_formed_tool_call(rt, seed):
    task = make_task(seed, "test")
    sid = rt.create_session(SessionCreate(messages=task.messages)).session_id
    try:
        out = rt.generate(sid, GenerateRequest(max_tokens=96, temperature=0.0))
    finally:
        rt.delete_session(sid)
    assert out.message.tool_calls, f"no parseable tool call in {out.message.content!r}"
    for call in out.message.tool_calls:
        assert validate_call(call.function.name, call.function.arguments, task.tools) is None


def test_trained_loss_far_below_random(rt):
    tok = ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")
    trained = heldout_loss(rt.model, tok, n=3, max_len=1024)["loss"]
    random = heldout_loss(seeded_model(rt.model.config), tok, n=3, max_len=1024)["loss"]
    assert trained < 0.5 * random, (trained, random)


def test_copying_probe_scores_the_trained_model_above_random(rt, capsys):
    """``evaluate --drills``: teacher-forced top-1 on copied tokens, per drill kind, from the CLI."""
    from leyline_training.evaluate import drill_accuracy, main

    result = main(["--drills", "2", "--tasks", "0", "--ppl-transcripts", "0", "--threads", "1"])
    trained = result["copying"]
    assert set(trained) == {"echo", "recall", "compute"}
    assert json.loads(capsys.readouterr().out)["copying"] == trained
    tok = ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")
    random = drill_accuracy(seeded_model(rt.model.config), tok, n=2)
    for kind, score in trained.items():
        assert score["tokens"] == random[kind]["tokens"] > 0
        assert 0.0 <= random[kind]["top1"] < score["top1"] <= 1.0, (kind, score, random[kind])
