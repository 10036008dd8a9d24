"""``leyline-bench vllm``'s plan, without vLLM: the shape tables, the cells and their arguments,
the tax cell's A/B order, the shared-prompt cell's prompts."""

import argparse
import json
import statistics
import sys

import pytest

from leyline_bench import cli
from leyline_testkit import cpu, vllm_server
from leyline_testkit.vllm_server import CONNECTOR_CONFIG, VllmServer, serve_command
from leyline_bench.vllm import vllm
from leyline_bench.vllm.cells import (
    CELLS,
    parse_cells,
    rounds_per_stream,
    session_tails,
    shared_prefix,
    spread,
    tax_schedule,
)
from leyline_testkit.tiny_models import FAMILIES, SHAPES, parameter_count, runtime_tokenizer_file, shape_config
from leyline_runtime.text.tokenizer import ChatTokenizer


def test_v2_lite_attn_is_deepseek_v2_lite_attention_at_12_dense_layers():
    config = shape_config("deepseek_v2", "v2-lite-attn")
    assert {k: config[k] for k in ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                                   "qk_nope_head_dim", "v_head_dim", "num_hidden_layers", "intermediate_size")} == {
        "hidden_size": 2048, "num_attention_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "num_hidden_layers": 12, "intermediate_size": 11264}
    assert config["first_k_dense_replace"] >= config["num_hidden_layers"]  # every layer dense: no MoE kernels
    assert 0.95e9 < parameter_count("deepseek_v2", "v2-lite-attn") < 1.1e9


def test_qwen3_real_shape_is_gqa_of_qwen3_06b():
    config = shape_config("qwen3", "qwen3-0.6b")
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["num_hidden_layers"]) == (1024, 16, 8, 128, 28)
    assert config["rope_parameters"] == FAMILIES["qwen3"].rope  # the family's rotary, unchanged
    assert 0.4e9 < parameter_count("qwen3", "qwen3-0.6b") < 0.5e9


def test_tiny_is_every_familys_own_shape():
    for family, spec in FAMILIES.items():
        assert shape_config(family, "tiny") == spec.config_arguments()
    assert parameter_count("deepseek_v2") < 10e6


@pytest.mark.parametrize("family,shape,named", [("qwen3", "v2-lite-attn", "qwen3-0.6b"),
                                                ("deepseek_v2", "qwen3-0.6b", "v2-lite-attn"),
                                                ("deepseek_v2", "huge", "known"), ("nope", "tiny", "known")])
def test_a_shape_that_does_not_fit_the_family_is_refused_with_the_choices(family, shape, named):
    with pytest.raises(ValueError, match=named):
        shape_config(family, shape)


def test_every_shape_names_families_that_exist():
    for spec in SHAPES.values():
        assert set(spec.families) <= set(FAMILIES)


def bench_args(*argv: str) -> argparse.Namespace:
    return cli.parse(["vllm", *argv])


def test_arguments_default_to_the_tiny_mla_model_and_every_cell():
    args = bench_args()
    assert (args.family, args.shape, args.cells, args.tokens) == ("deepseek_v2", "tiny", list(CELLS), [2048])
    args = bench_args("--family", "qwen3", "--shape", "qwen3-0.6b", "--cells", "tax,edits", "--tokens", "2048", "4096")
    assert (args.family, args.shape, args.cells, args.tokens) == ("qwen3", "qwen3-0.6b", ["edits", "tax"], [2048, 4096])


def test_bad_cells_are_an_argument_error():
    for text in ("edits,warp", "", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="comma list"):
            parse_cells(text)
    with pytest.raises(SystemExit):
        bench_args("--cells", "warp")


def test_a_family_shape_mismatch_fails_before_any_checkpoint_or_server(tmp_path):
    args = bench_args("--family", "qwen3", "--shape", "v2-lite-attn", "--workdir", str(tmp_path))
    with pytest.raises(ValueError, match="qwen3-0.6b"):
        vllm.run(args)
    assert list(tmp_path.iterdir()) == []


def test_quick_shrinks_every_cell_but_keeps_what_was_given():
    args = bench_args("--quick", "--tokens", "1024", "--cells", "shared,tax")
    assert args.tokens == [1024] and args.cells == ["shared", "tax"]
    assert (args.repeats, args.shared_sessions, args.tax_repeats, args.tax_requests) == (1, 2, 1, 16)


def test_every_tax_measurement_sends_as_many_requests_at_one_stream_as_at_sixteen():
    assert [rounds_per_stream(64, n) * n for n in (1, 16)] == [64, 64]
    assert rounds_per_stream(10, 16) == 1 and rounds_per_stream(17, 16) == 2


def test_tax_arms_alternate_and_each_goes_first_equally_often():
    order = tax_schedule(4)
    assert order == [(0, "plain"), (0, "plugin"), (1, "plugin"), (1, "plain"),
                     (2, "plain"), (2, "plugin"), (3, "plugin"), (3, "plain")]
    firsts = [arm for i, (_, arm) in enumerate(order) if i % 2 == 0]
    assert firsts.count("plain") == firsts.count("plugin")
    assert [r for r, _ in tax_schedule(3)] == [0, 0, 1, 1, 2, 2]


def test_spread_reports_median_and_range():
    s = spread([100.0, 90.0, 110.0])
    assert (s["median"], s["min"], s["max"]) == (100.0, 90.0, 110.0)
    assert s["rel_spread"] == pytest.approx(0.2)
    assert spread([5.0])["rel_spread"] == 0


def test_shared_prefix_has_the_asked_length_and_every_session_its_own_task():
    tok = ChatTokenizer.from_file(runtime_tokenizer_file())
    prefix = shared_prefix(tok, 1536)
    assert 1536 <= sum(len(tok.encode_message(m)) for m in prefix) < 1536 + 40
    assert prefix[0].role == prefix[-1].role == "system"
    tails = session_tails(8)
    assert len({t[0].content for t in tails}) == 8
    sizes = [len(tok.encode_message(t[0])) for t in tails]
    assert statistics.median(sizes) < 1536 / 4  # the common prefix is most of every prompt


def test_the_plain_arm_loads_no_plugin_and_the_plugin_arm_all_of_it(tmp_path):
    plain = VllmServer(tmp_path / "ckpt", tmp_path / "plain", plugin=False)
    assert plain.env["VLLM_PLUGINS"] == ""  # matches no plugin (unset would load every general plugin)
    assert "--kv-transfer-config" not in plain.cmd and "--worker-extension-cls" not in plain.cmd
    leyline = VllmServer(tmp_path / "ckpt", tmp_path / "leyline")
    assert leyline.env["VLLM_PLUGINS"] == "leyline"
    assert "--kv-transfer-config" in leyline.cmd and "--worker-extension-cls" in leyline.cmd
    assert [a for a in leyline.cmd if a not in plain.cmd and not a.isdigit()] == [
        "--kv-transfer-config", json.dumps(CONNECTOR_CONFIG), "--worker-extension-cls",
        "leyline_vllm.kv.worker_extension.LeylineWorkerExtension"]


def test_an_interrupted_start_leaves_no_server_behind(tmp_path, monkeypatch):
    server = VllmServer(tmp_path / "ckpt", tmp_path / "serve")
    server.cmd = [sys.executable, "-c", "import time; time.sleep(120)"]  # never healthy

    def interrupt(*_args, **_kwargs):  # Ctrl-C while waiting for /health
        raise KeyboardInterrupt

    monkeypatch.setattr(vllm_server.httpx, "get", interrupt)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.proc.poll() is not None


@pytest.mark.parametrize("amx", [False, True])
def test_serve_command_names_each_length_and_block_flag_once(monkeypatch, amx):
    """vLLM's argparse keeps the last of a repeated flag: one per flag, so the command says what ran."""
    monkeypatch.setattr(vllm_server, "vllm_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_server, "has_amx", lambda: amx)
    cmd = serve_command("ckpt", 8000, dtype="float32", max_model_len=2048, block_size=64)
    assert cmd.count("--max-model-len") == 1 and cmd[cmd.index("--max-model-len") + 1] == "2048"
    assert cmd.count("--block-size") == 1 and cmd[cmd.index("--block-size") + 1] == "64"
    default = serve_command("ckpt", 8000, dtype="float32")
    assert default.count("--block-size") == (1 if amx else 0)


@pytest.mark.parametrize("flags, isa, native_bf16", [
    ("fpu sse2 avx avx2 fma", "AVX2 only", False),
    ("avx2 avx512f avx512bw", "AVX512, no BF16", False),
    ("avx2 avx512f avx512_bf16", "AVX512-BF16, no AMX", True),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "AMX", True),
])
def test_the_cpu_is_named_by_the_extensions_that_decide_its_speed(monkeypatch, flags, isa, native_bf16):
    """Reports name the ISA beside the model name ("AMD EPYC" is AVX2-only on one machine here and
    AVX512-BF16 on another), and real weights are served in fp32 where vLLM's CPU build would emulate bf16."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags.split()))
    assert cpu.cpu_isa() == isa and cpu.has_native_bf16() is native_bf16
    assert cpu.has_amx() is (isa == "AMX")
    monkeypatch.setattr(vllm_server, "has_native_bf16", cpu.has_native_bf16)
    monkeypatch.setattr(vllm_server, "vllm_on_cpu", lambda: True)
    assert vllm_server.real_weights_dtype() == ("bfloat16" if native_bf16 else "float32")
    monkeypatch.setattr(vllm_server, "vllm_on_cpu", lambda: False)  # a GPU: bf16 whatever the host CPU
    assert vllm_server.real_weights_dtype() == "bfloat16"
