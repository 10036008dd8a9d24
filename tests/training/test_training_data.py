"""Training data: generator determinism, held-out split, tool calls, tokenizer, packing (fast)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from leyline_runtime.text import chat_template as tpl
from leyline_runtime.model.default import default_tokenizer_path
from leyline_runtime.text.tokenizer import ChatTokenizer
from leyline_sdk.protocol import FunctionCall, Message, ToolCall
from leyline_training import names as N
from leyline_training.corpus import (
    CLS_ASSISTANT,
    CLS_TEXT,
    DataMix,
    Packer,
    loss_weights,
    render_transcript,
    stdlib_files,
    transcript_tokens,
)
from leyline_training.evaluate import oracle_generate, run_agent_eval
from leyline_training.tools import (
    TOOLS,
    calculator,
    execute,
    execute_test_file,
    kv_get,
    run_tests,
    validate_call,
)
from leyline_training.train import DataStream, lr_at, parse_curriculum
from leyline_training.transcripts import KINDS, TaskMix, make_task, make_transcript
from leyline_training.world import make_world

SEEDS = range(60)


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_file(default_tokenizer_path())


@pytest.fixture(scope="module")
def transcripts():
    return [make_transcript(s, split) for split in ("train", "test") for s in SEEDS]


def _dump(tr):
    return [m.model_dump() for m in tr.messages]


def test_generator_is_deterministic():
    for seed in (0, 7, 123):
        for split in ("train", "test"):
            a, b = make_transcript(seed, split), make_transcript(seed, split)
            assert _dump(a) == _dump(b)
            assert a.task.expected == b.task.expected and a.task.world.files == b.task.world.files
    assert _dump(make_transcript(1, "train")) != _dump(make_transcript(2, "train"))


def test_every_kind_builds_and_its_answer_checks(transcripts):
    seen = {tr.task.kind for tr in transcripts}
    assert len(seen) >= len(KINDS) - 2
    for kind in KINDS:
        for seed in range(40):
            try:
                tr = make_transcript(seed, "train", kind=kind)
            except RuntimeError:
                continue
            assert tr.task.kind == kind
            break
        else:
            pytest.fail(f"no {kind} task in 40 seeds")
    for tr in transcripts:
        # follow-up tasks share the history; each final answer passes its own check
        answers = [i for i, m in enumerate(tr.messages) if m.role == "assistant" and not m.tool_calls]
        assert len(answers) == len(tr.tasks)
        for task, i in zip(tr.tasks, answers):
            assert task.check(tr.messages[i].content), (task.task_id, tr.messages[i].content)
            assert not task.check(""), task.task_id
        assert tr.messages[0].role == "system" and tr.task.messages[-1].role == "user"


def test_check_matches_whole_values_only():
    task = make_task(3, "test", kind="calc")
    value = task.expected
    assert task.check(f"The result is {value}.")
    assert not task.check(f"The result is {value}7.")
    assert not task.check(f"The result is 1{value}.")


def assert_entities_named_from(world, pool: set[str]) -> None:
    for name in world.services:
        assert name.split("-")[0] in pool
    for mod in world.modules.values():
        assert mod.name.split("_")[0] in pool
    for key in world.kv:
        assert key.split(".")[0].split("_")[0] in pool


def test_splits_are_disjoint():
    train, test = set(N.nouns("train")), set(N.nouns("test"))
    assert train and test and not train & test
    assert len(test) >= 40
    for seed in range(40):
        assert_entities_named_from(make_world(str(seed), "test"), test)
    # the same seed gives different tasks in the two splits
    assert make_task(5, "train").messages[-1].content != make_task(5, "test").messages[-1].content
    with pytest.raises(ValueError):
        make_transcript(0, "validation")


def test_tool_calls_round_trip_through_parse_assistant(transcripts):
    n_calls = 0
    for tr in transcripts:
        for m in tr.messages:
            if m.role != "assistant" or not m.tool_calls:
                continue
            parsed = tpl.parse_assistant(tpl.render_body(m))
            assert not parsed.malformed
            assert parsed.content == m.content
            assert [c.function.name for c in parsed.tool_calls] == [c.function.name for c in m.tool_calls]
            assert [json.loads(c.function.arguments) for c in parsed.tool_calls] == \
                [json.loads(c.function.arguments) for c in m.tool_calls]
            n_calls += len(m.tool_calls)
    assert n_calls > len(transcripts)


def test_tool_results_are_what_execute_returns(transcripts):
    names = {t["function"]["name"] for t in TOOLS}
    errors = 0
    for tr in transcripts:
        world = tr.task.world
        pending = []
        for m in tr.messages:
            if m.role == "assistant" and m.tool_calls:
                assert not pending
                pending = list(m.tool_calls)
            elif m.role == "tool":
                call = pending.pop(0)
                assert call.function.name in names
                assert m.tool_call_id == call.id
                assert m.content == execute(world, call.function.name, json.loads(call.function.arguments))
                errors += m.content.startswith("Error")
        assert not pending
    assert errors > 0  # failed calls followed by retries are part of the data


def test_transcript_shapes(transcripts):
    rounds = [tr.tool_rounds for tr in transcripts]
    assert min(rounds) >= 1 and max(rounds) >= 4
    assert any(len(m.content.splitlines()) >= 30 for tr in transcripts for m in tr.messages if m.role == "tool")
    assert any(len(tr.tasks) > 1 for tr in transcripts)
    assert all(tpl.render_tools(tr.task.tools) in tr.messages[0].content for tr in transcripts)
    assert not any(tr.messages[1].role == "system" for tr in transcripts)  # the shipped recipe's layout
    # with --api-share, some start the way API requests do: the tools message, then the system prompt
    api_half = TaskMix(api_share=0.5)
    api = [tr for s in SEEDS if (tr := make_transcript(s, "train", mix=api_half)).messages[1].role == "system"]
    assert api and all(tr.messages[0].content.startswith(tpl.render_tools(tr.task.tools)) for tr in api)


def test_tools():
    assert calculator("(37*12)-5") == "439"
    assert calculator("10/4") == "2.5"
    assert calculator("(1+2").startswith("Error: SyntaxError")
    assert calculator("1/0") == "Error: ZeroDivisionError: division by zero"
    assert calculator("__import__('os')").startswith("Error")
    assert calculator("2**10**10").startswith("Error")
    w = make_world("11", "train")
    key = next(iter(w.kv))
    assert kv_get(w, key) == w.kv[key]
    assert kv_get(w, key + "x") == f"Error: KeyError: '{key}x' not found. Did you mean '{key}'?"
    assert execute(w, "nope", {}).startswith("Error: unknown tool")
    assert execute(w, "kv_get", {}).startswith("Error: TypeError")
    assert execute(w, "kv_get", "{not json").startswith("Error: ValueError")
    out = run_tests(w)
    for mod in w.modules.values():
        for name, ok, reason in execute_test_file(w, mod.test_path):
            assert f"{mod.test_path}::{name} {'PASSED' if ok else 'FAILED'}" in out
            if not ok:
                assert f"FAILED {mod.test_path}::{name} - {reason}" in out
    assert run_tests(w, "tests/missing.py").startswith("Error: no tests found")


def test_tokenizer_round_trips_and_has_special_tokens(tok):
    assert tok.vocab_size == 8192
    for i, special in enumerate(tpl.SPECIAL_TOKENS):
        assert tok.token_id(special) == i
    rng = random.Random(0)
    alphabet = [chr(c) for c in list(range(32, 127)) + [9, 10, 13, 0xe9, 0x3b1, 0x4e2d, 0x1f680, 0x200b]]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert tok.decode(tok.encode(text)) == text
    call = Message(role="assistant", tool_calls=[ToolCall(id="c", function=FunctionCall(
        name="kv_get", arguments='{"key": "a.b"}'))])
    assert len(tok.encode_message(call)) - 2 <= 24  # without role header and end marker
    # text is text: the same string as content has no special token in it
    assert not set(tok.encode(tpl.render_tool_call(call.tool_calls[0]))) & tok.special_ids


def test_training_tokenization_equals_runtime_tokenization(tok, transcripts):
    for tr in transcripts[:20]:
        ids, cls = transcript_tokens(tok, tr.messages)
        assert ids == [t for m in tok.encode_messages(tr.messages) for t in m]
        assert len(cls) == len(ids) and CLS_ASSISTANT in cls
        assert tok.decode(ids) == render_transcript(tr.messages)


def test_packed_batch_shape(tok):
    assert len(stdlib_files()) > 100
    packer = Packer(tok, rows_per_shard=4)
    shard = packer.shard(0, 512)
    assert shard.tokens.shape == (4, 513) and shard.classes.shape == (4, 513)
    assert shard.tokens[0, 0] == tok.role_ids["system"]  # a conversation starts at position 0
    assert shard.transcripts > 0 and shard.text_tokens > 0
    assert (shard.tokens < tok.vocab_size).all()
    again = packer.shard(0, 512)
    assert np.array_equal(shard.tokens, again.tokens)
    stream = DataStream(packer)
    rows, classes = stream.next(2, 512)
    assert rows.shape == (2, 513)
    w = loss_weights(classes, assistant_weight=2.0)
    assert w.shape == (2, 512) and set(np.unique(w)) <= {1.0, 2.0}
    assert CLS_TEXT in classes
    # resuming at a data position yields the same next batch
    stream.next(2, 512)
    nxt = stream.next(2, 512)[0]
    resumed = DataStream(packer, 1, 0).next(2, 512)[0]
    assert np.array_equal(nxt, resumed)


def test_schedule():
    assert parse_curriculum("1024:0.3", 2048) == [(0.3, 1024), (1.0, 2048)]
    assert lr_at(0, 0.0, lr=1e-3, warmup=10, min_ratio=0.1) == pytest.approx(1e-4)
    assert lr_at(100, 0.0, lr=1e-3, warmup=10, min_ratio=0.1) == pytest.approx(1e-3)
    assert lr_at(100, 1.0, lr=1e-3, warmup=10, min_ratio=0.1) == pytest.approx(1e-4)


def test_agent_eval_harness_with_the_worked_solutions():
    lookup = {}
    for s in range(12):
        tr = make_transcript(s, "test")
        lookup[tr.task.messages[-1].content] = tr.messages[len(tr.task.messages):]
    result = run_agent_eval(oracle_generate(lookup), 12)
    assert result["task_success_rate"] == 1.0
    assert result["well_formed_tool_call_rate"] == 1.0
    assert result["mean_turns"] > 1

    def broken(messages, tools):
        return '<|tool_call|>{"name": "kv_get", "arguments": {"key": 1}}<|end_tool_call|>' \
            '<|tool_call|>{"nam<|end_tool_call|>'

    bad = run_agent_eval(broken, 3, max_turns=2)
    assert bad["task_success_rate"] == 0.0
    assert bad["tool_calls_attempted"] == 12 and bad["well_formed_tool_call_rate"] == 0.0


def _langgraph_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "langgraph_agent.py"
    spec = importlib.util.spec_from_file_location("langgraph_agent_for_training_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_order_tasks_are_the_langgraph_examples_kind_of_task():
    """The "order" kind trains on what examples/langgraph_agent.py sends: its tools exactly as LangChain
    renders them, its prompt layout and wording, its tools' output formats; not its names and numbers."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from leyline_training.tools import ORDER_TOOLS
    from leyline_training.transcripts import ORDER_PROMPTS, ORDER_QUESTIONS

    example = _langgraph_example()
    assert [convert_to_openai_tool(t) for t in (example.calculator, example.read_file)] == ORDER_TOOLS
    assert ORDER_QUESTIONS[0].format(n=42) in example.__dict__["run"].__code__.co_consts
    assert ORDER_PROMPTS[0] in example.__dict__["run"].__code__.co_consts
    example.make_workdir()
    with pytest.raises(Exception) as missing:
        example.read_file.func("config.txt")
    world = make_world("0", "test")
    world.files["config.ini"] = "x"
    assert str(missing.value) == execute(world, "read_file", {"path": "config.txt"})
    for expr in ("2.25 * 1 + 9.25 * 4", "70.75 * (1 - 0.15) + 7.5", "7 / 2", "6 / 3"):
        assert example.calculator.func(expr) == calculator(expr)
    # held out: none of the example's item names is a training noun
    items = {item.split("-")[0] for item, _, _ in example.ORDER}
    assert not items & set(N.nouns("train"))

    transcripts = [make_transcript(s, "train", kind="order") for s in range(40)]
    for tr in transcripts:
        assert tr.task.tools == ORDER_TOOLS and tr.messages[1].content in ORDER_PROMPTS
        assert tr.task.check(tr.messages[-1].content)
    assert any(m.content.startswith("Error: FileNotFoundError") for tr in transcripts for m in tr.messages
               if m.role == "tool")


def test_drills_answers_are_copies_of_the_context():
    from leyline_training.drills import make_drill

    kinds = set()
    for seed in range(60):
        messages = make_drill(seed, "train")
        assert make_drill(seed, "train") == messages  # pure function of (seed, split)
        context = ""
        for m in messages:
            if m.role == "assistant":
                for call in m.tool_calls or []:
                    args = json.loads(call.function.arguments)
                    assert validate_call(call.function.name, args) is None
                    assert all(str(v) in context for v in args.values()) or call.function.name == "read_file"
                    kinds.add(call.function.name)
                if m.content:
                    tail = m.content.rstrip(".").split()[-1].rstrip(".")
                    assert tail in context, (m.content, context[-300:])
            context += m.content + "\n"
    assert kinds == {"calculator", "read_file"}


def test_packer_mixes_drills_in_by_share(tok):
    plain = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.0), seed=5).shard(0, 1024)
    drilled = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.5), seed=5).shard(0, 1024)
    assert np.array_equal(plain.tokens, Packer(tok, DataMix(transcript_share=0.95), seed=5).shard(0, 1024).tokens)
    again = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.5), seed=5).shard(0, 1024)
    assert np.array_equal(drilled.tokens, again.tokens)
    # drills are short and all-answer: more conversations, a larger share of assistant tokens
    assert drilled.transcripts > plain.transcripts
    assert (drilled.classes == CLS_ASSISTANT).mean() > (plain.classes == CLS_ASSISTANT).mean()


def test_token_echo_replies_copy_random_user_runs_and_only_replies_carry_loss(tok):
    from leyline_training.corpus import CLS_NOISE, loss_weights, token_echo

    user, assistant, end = (tok.token_id(t) for t in (tpl.ROLE_TOKENS["user"], tpl.ROLE_TOKENS["assistant"], tpl.END))
    for seed in range(20):
        ids, cls = token_echo(tok, seed, 256)
        assert (ids, cls) == token_echo(tok, seed, 256) and len(ids) == len(cls) <= 256
        assert tok.decode(ids[:1]) == tpl.ROLE_TOKENS["system"]
        starts = [i for i, t in enumerate(ids) if t == user]
        assert starts
        for s in starts:
            e = ids.index(end, s)
            run = ids[s + 1:e]
            assert 3 <= len(run) <= 24 and len(set(run)) == len(run)
            assert not set(run) & tok.control_ids
            assert cls[s + 1:e] == [CLS_NOISE] * len(run)
            assert ids[e + 1] == assistant and ids[e + 2:e + 2 + len(run)] == run and ids[e + 2 + len(run)] == end
            assert cls[e + 2:e + 3 + len(run)] == [CLS_ASSISTANT] * (len(run) + 1)
        weights = loss_weights(np.array([cls]))[0]
        assert (weights[np.array(cls[1:]) == CLS_NOISE] == 0).all() and weights.max() > 0


def test_packer_mixes_token_echo_in_by_share(tok):
    from leyline_training.corpus import CLS_NOISE

    plain = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.3), seed=5).shard(0, 512)
    assert not (plain.classes == CLS_NOISE).any()
    mixed = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.3, token_echo_share=0.5), seed=5).shard(0, 512)
    share = (mixed.classes == CLS_NOISE).mean()
    assert 0.05 < share < 0.5, share
    again = Packer(tok, DataMix(transcript_share=0.95, drill_share=0.3, token_echo_share=0.5), seed=5).shard(0, 512)
    assert np.array_equal(mixed.tokens, again.tokens)


@pytest.mark.parametrize(("split", "size"), [("wide", 4000), ("english", 2997)])
def test_unmemorisable_splits_name_entities_from_their_own_pool_only(split, size):
    pools = {name: set(N.nouns(name)) for name in N.NOUNS}
    own = pools.pop(split)
    assert len(own) == size and not own & set().union(*pools.values())
    for seed in range(20):
        assert_entities_named_from(make_world(str(seed), split), own)
    for seed in range(40):  # every kind still builds, and its worked answer checks
        t = make_transcript(seed, split)
        assert t.tasks[-1].check(t.messages[-1].content), (t.tasks[-1].kind, t.tasks[-1].expected)


def _names_in(text: str, split: str) -> int:
    return sum(f" {w}" in text or f"/{w}" in text for w in N.nouns(split))


def test_packer_mixes_unmemorisable_names_in_by_share(tok):
    kw = {"transcript_share": 0.95, "drill_share": 0.3, "order_share": 0.25}

    def shard(**shares):
        return Packer(tok, DataMix(**kw, **shares), seed=5).shard(0, 1024)

    plain = shard()
    for zero in ({"wide_share": 0.0}, {"english_share": 0.0}, {"wide_share": 0.0, "english_share": 0.0}):
        assert np.array_equal(plain.tokens, shard(**zero).tokens)
    wide = shard(wide_share=0.6)
    # the english die is the wide one: adding a zero english share changes nothing
    assert np.array_equal(wide.tokens, shard(wide_share=0.6, english_share=0.0).tokens)
    text = " ".join(tok.decode(row.tolist()) for row in wide.tokens)
    assert _names_in(text, "wide") >= 20
    both = shard(wide_share=0.3, english_share=0.4)
    assert np.array_equal(both.tokens, shard(wide_share=0.3, english_share=0.4).tokens)
    text = " ".join(tok.decode(row.tolist()) for row in both.tokens)
    # real words also occur in the stdlib text that fills rows: count beyond the plain shard's
    before = " ".join(tok.decode(row.tolist()) for row in plain.tokens)
    assert _names_in(text, "wide") >= 10, _names_in(text, "wide")
    assert _names_in(text, "english") >= _names_in(before, "english") + 10, (
        _names_in(text, "english"), _names_in(before, "english"))


def test_train_init_from_starts_at_those_weights_and_saves_bf16(tmp_path):
    import torch
    from safetensors import safe_open

    from leyline_runtime.model import load_model, seeded_model
    from leyline_runtime.model.default import DEFAULT_MODEL_DIR
    from leyline_training.train import train

    summary = train(tmp_path / "run", init_from=DEFAULT_MODEL_DIR, max_steps=1, seq_len=1024, lr=1e-9,
                    warmup_steps=1, eval_transcripts=0, rows_per_shard=2, log=lambda *_: None)
    assert summary["steps"] == 1 and summary["init_from"] == str(DEFAULT_MODEL_DIR)
    with safe_open(str(tmp_path / "run" / "model" / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    start, trained = load_model(str(DEFAULT_MODEL_DIR)), load_model(str(tmp_path / "run" / "model"))
    fresh = seeded_model(start.config)
    w = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    start_w, trained_w = start.state_dict()[w], trained.state_dict()[w]
    assert torch.allclose(trained_w, start_w, rtol=1e-2, atol=1e-3)  # bf16 rounding of a 1e-9 step
    assert not torch.allclose(fresh.state_dict()[w], start_w, rtol=1e-2, atol=1e-3)


def test_custom_tool_tasks_copy_request_values_into_a_valid_call_of_an_offered_tool():
    import re

    families, choices, scripts, cjk = set(), set(), set(), set()
    for seed in range(80):
        for split in ("train", "test"):
            tr = make_transcript(seed, split, "custom_tool")
            task = tr.task
            call_msg, result_msg, answer = tr.messages[-3:]
            assert task.kind == "custom_tool" and tr.messages[:-3] == task.messages
            (call,) = call_msg.tool_calls
            offered = [t["function"]["name"] for t in task.tools]
            assert call.function.name in offered and len(set(offered)) == len(offered)
            assert validate_call(call.function.name, call.function.arguments, task.tools) is None
            args = json.loads(call.function.arguments)
            props = next(t for t in task.tools if t["function"]["name"] == call.function.name)["function"]
            for key, value in args.items():  # integers are integers; the value the call needs is in the request
                assert isinstance(value, int) == (props["parameters"]["properties"][key]["type"] == "integer")
                if key != "description":
                    assert str(value) in task.messages[-1].content, (value, task.messages[-1].content)
            assert "\\u" not in call.function.arguments  # non-ASCII names are written as themselves
            # the world runs the tool: the transcript's result, and the answer quotes what the check wants
            assert execute(task.world, call.function.name, call.function.arguments) == result_msg.content
            assert task.check(answer.content) and not task.check("no idea")
            assert execute(task.world, call.function.name, "{}").startswith("Error: TypeError")
            for key, value in args.items():  # a number sent as a string is no well-formed call
                if isinstance(value, int):
                    as_text = json.dumps({**args, key: str(value)})
                    assert "must be an integer" in validate_call(call.function.name, as_text, task.tools)
                    assert execute(task.world, call.function.name, as_text).startswith("Error: TypeError")
            unknown = execute(task.world, "no_such_tool", "{}")  # lists the tools this task offers
            assert unknown.startswith("Error: unknown tool") and all(name in unknown for name in offered)
            head = task.messages[0].content
            choices.add("named" if "Call the tool" in head else "required" if "Call one of" in head else "auto")
            families.add(re.sub(r"_.*", "", call.function.name) if "function" not in call.function.name else "fn")
            scripts.add(any(ord(ch) > 0x3000 for ch in call.function.arguments))
            cjk.update(ch for ch in call.function.arguments if 0x4E00 <= ord(ch) <= 0x9FFF)
        assert make_transcript(seed, "train", "custom_tool").messages == make_transcript(
            seed, "train", "custom_tool").messages
    assert choices == {"auto", "required", "named"} and scripts == {True, False} and len(families) >= 5
    # CJK names span the whole block (too many characters to memorise: they must be copied)
    assert len(cjk) > 100 and max(map(ord, cjk)) - min(map(ord, cjk)) > 0x4000


def test_custom_tool_share_draws_only_when_asked_for():
    for seed in SEEDS:
        plain = make_transcript(seed, "train", mix=TaskMix(order_share=0.2, api_share=0.3))
        zero = TaskMix(order_share=0.2, api_share=0.3, custom_tool_share=0.0)
        assert plain.messages == make_transcript(seed, "train", mix=zero).messages
    kinds = [make_transcript(s, "train", mix=TaskMix(custom_tool_share=0.5)).task.kind for s in SEEDS]
    assert 0.3 < kinds.count("custom_tool") / len(kinds) < 0.7


def test_agent_eval_runs_custom_tool_tasks_with_their_own_tools():
    lookup = {}
    for s in range(12):
        tr = make_transcript(s, "test", mix=TaskMix(custom_tool_share=1.0))
        lookup[tr.task.messages[-1].content] = tr.messages[len(tr.task.messages):]
    result = run_agent_eval(oracle_generate(lookup), 12, mix=TaskMix(custom_tool_share=1.0))
    assert result["task_success_rate"] == 1.0 and result["well_formed_tool_call_rate"] == 1.0
    assert set(result["by_kind"]) == {"custom_tool"}


# Digests of the data older recipes were trained on, taken before the writing-system drills were added:
# a recipe without --script-share must still get exactly that data.
CUSTOM_AND_DRILLS_SHA256 = "10867b7c81ba91a1f4ab4a621edbf0c54273e70541ce06b4e69d1431872ebe5a"
RUN8_MIX_SHARD_SHA256 = "3a4085f36a5ad0c53b74601552cca73c2b18c0c737400a516c49fb46922930d1"


def test_train_resumes_from_its_checkpoint(tmp_path):
    """A second run on the same folder continues the step count, data position and log of the first."""
    from leyline_runtime.model.default import DEFAULT_MODEL_DIR
    import torch

    from leyline_training.train import CHECKPOINT, train

    args = dict(init_from=DEFAULT_MODEL_DIR, seq_len=1024, lr=1e-9, warmup_steps=1, eval_transcripts=0,
                rows_per_shard=2, log_every=1, curriculum=None, log=lambda *_: None)
    first = train(tmp_path / "run", max_steps=1, **args)
    saved = torch.load(tmp_path / "run" / CHECKPOINT, map_location="cpu", weights_only=False)
    assert saved["step"] == 1 and len(saved["history"]) == 1
    second = train(tmp_path / "run", max_steps=2, **args)
    assert (first["steps"], second["steps"]) == (1, 2)
    assert second["tokens"] == 2 * first["tokens"] and second["stop"] == "max_steps"
    assert second["data_position"] != first["data_position"]
    resumed = torch.load(tmp_path / "run" / CHECKPOINT, map_location="cpu", weights_only=False)
    assert [r["step"] for r in resumed["history"]] == [1, 2]


def test_recipes_without_script_drills_get_the_data_they_were_trained_on(tok):
    import hashlib

    from leyline_training.custom_tools import make_custom_tool_task
    from leyline_training.drills import make_drill

    h = hashlib.sha256()
    for s in range(200):
        t = make_custom_tool_task(random.Random(f"t:{s}"), "train")
        h.update(json.dumps([m.model_dump() for m in t.messages + t.solution], sort_keys=True).encode())
        h.update(json.dumps([m.model_dump() for m in make_drill(s)], sort_keys=True).encode())
    assert h.hexdigest() == CUSTOM_AND_DRILLS_SHA256
    mix = DataMix(transcript_share=0.95, drill_share=0.15, token_echo_share=0.05, custom_tool_share=0.3,
                  order_share=0.2, api_share=0.3)
    shard = Packer(tok, mix, seed=9).shard(0, 1024)
    assert hashlib.sha256(shard.tokens.tobytes() + shard.classes.tobytes()).hexdigest() == RUN8_MIX_SHARD_SHA256


def test_script_drills_copy_text_of_other_writing_systems(tok):
    from leyline_training.corpus import CLS_NOISE
    from leyline_training.drills import make_script_drill
    from leyline_training.writing_systems import SCRIPT_BLOCKS

    echoes = calls = 0
    scripts = set()
    for seed in range(80):
        messages, echo = make_script_drill(seed)
        assert (messages, echo) == make_script_drill(seed)
        ids, cls = transcript_tokens(tok, messages, random_user_text=echo)
        assert tok.decode(ids) == render_transcript(messages)  # the ids are the text's, byte for byte
        if echo:
            echoes += 1
            users = [m.content for m in messages if m.role == "user"]
            assert users == [m.content for m in messages if m.role == "assistant"]
            assert any(ord(ch) > 127 for ch in "".join(users))
            assert CLS_NOISE in cls and cls.count(CLS_ASSISTANT) > 0
            scripts |= {s for s, (lo, hi) in SCRIPT_BLOCKS.items() for ch in "".join(users) if lo <= ord(ch) <= hi}
        else:
            calls += 1
            assert CLS_NOISE not in cls
            call = messages[-3].tool_calls[0]
            args = json.loads(call.function.arguments)
            name = next(v for k, v in args.items() if k != "description")
            request = next(m.content for m in messages if m.role == "user")
            assert any(ord(ch) > 127 for ch in name) and name in request and name in call.function.arguments
    assert echoes > 20 and calls > 20 and len(scripts) == len(SCRIPT_BLOCKS)


def test_packer_mixes_script_drills_in_by_share(tok):
    from leyline_training.corpus import CLS_NOISE

    kw = {"transcript_share": 0.95, "drill_share": 0.3}
    plain = Packer(tok, DataMix(**kw), seed=5).shard(0, 1024)
    assert np.array_equal(plain.tokens, Packer(tok, DataMix(**kw, script_share=0.0), seed=5).shard(0, 1024).tokens)
    mixed = Packer(tok, DataMix(**kw, script_share=0.5), seed=5).shard(0, 1024)
    assert np.array_equal(mixed.tokens, Packer(tok, DataMix(**kw, script_share=0.5), seed=5).shard(0, 1024).tokens)
    assert not (plain.classes == CLS_NOISE).any() and (mixed.classes == CLS_NOISE).any()
    # UTF-8 lead bytes of 3-byte characters (CJK, kana, Hangul, Thai, Devanagari) as single-byte tokens
    lead3 = [tok.token_id(t) for t in ("ä", "å", "æ", "ç", "è", "é")]
    assert np.isin(mixed.tokens, lead3).sum() > 10 * max(1, np.isin(plain.tokens, lead3).sum())


def test_script_call_probe_scores_a_copied_name(tok):
    from leyline_training.evaluate import script_calls

    def copier(messages, tools):  # calls the tool with the value the request quotes
        from leyline_training.custom_tools import make_custom_tool_task
        for seed in range(50):
            task = make_custom_tool_task(random.Random(f"script-call:test:{seed}"), "test", foreign=True)
            if task.messages == messages:
                return task.solution[0]
        raise AssertionError("unknown request")

    assert script_calls(copier, 6)["exact"] == 1.0
    wrong = script_calls(lambda m, t: Message(role="assistant", content="no call"), 6)
    assert wrong["exact"] == 0.0 and wrong["first_character"] == 0.0


@pytest.mark.slow  # a training step and an evaluation (~17 s on 2 cores): make test-slow
def test_the_training_command_line_trains_and_evaluates(tmp_path):
    """``leyline-train train`` / ``evaluate`` (run as ``python -m leyline_training``, what the
    console script calls): one step from the default model, then an evaluation of the result."""
    import json
    import subprocess
    import sys

    from leyline_runtime.model.default import DEFAULT_MODEL_DIR

    def leyline_train(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "leyline_training", *argv], capture_output=True,
                              text=True, timeout=600, check=False)

    run = tmp_path / "run"
    trained = leyline_train("train", "--out", str(run), "--init-from", str(DEFAULT_MODEL_DIR), "--max-steps", "1",
                            "--seq-len", "1024", "--lr", "1e-9", "--warmup-steps", "1", "--eval-transcripts", "0",
                            "--threads", "1")
    assert trained.returncode == 0, trained.stderr
    assert json.loads((run / "model" / "training.json").read_text())["steps"] == 1
    out = tmp_path / "eval.json"
    evaluated = leyline_train("evaluate", "--model", str(run / "model"), "--tasks", "1", "--max-turns", "1",
                              "--ppl-transcripts", "0", "--threads", "1", "--out", str(out))
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(out.read_text())["model"] == str(run / "model")
