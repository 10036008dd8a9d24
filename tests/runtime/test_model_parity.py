"""Oracle: transformers' DeepSeek-V2/V3 on tiny random configs vs our loader + model."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from leyline_runtime import load_model  # noqa: E402
from leyline_runtime.model import UnsupportedConfig  # noqa: E402

from helpers import cpu_gemm  # noqa: E402

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=12, max_position_embeddings=512)
MOE = dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=24,
           first_k_dense_replace=1, n_group=2, topk_group=1)
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
        "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}

CASES = {
    "v3-dense": ("v3", dict(first_k_dense_replace=3, q_lora_rank=None)),
    "v3-dense-noninterleaved": ("v3", dict(first_k_dense_replace=3, q_lora_rank=None, rope_interleave=False)),
    "v3-moe-qlora": ("v3", dict(MOE, q_lora_rank=24, routed_scaling_factor=2.5)),
    "v3-moe-yarn-tied": ("v3", dict(MOE, q_lora_rank=None, rope_scaling=YARN, tie_word_embeddings=True)),
    "v3-yarn-mscale-diff": ("v3", dict(first_k_dense_replace=3, q_lora_rank=None,
                                       rope_scaling=dict(YARN, mscale=1.0, mscale_all_dim=0.5))),
    "v2-dense": ("v2", dict(first_k_dense_replace=3, q_lora_rank=None)),
    "v2-moe-group-qlora": ("v2", dict(MOE, q_lora_rank=24, topk_method="group_limited_greedy")),
    "v2-moe-greedy-yarn": ("v2", dict(MOE, q_lora_rank=None, topk_method="greedy", rope_scaling=YARN,
                                      routed_scaling_factor=1.5)),
}


def build_reference(kind, overrides, seed=0):
    torch.manual_seed(seed)
    if kind == "v3":
        cfg = transformers.DeepseekV3Config(**BASE, **overrides)
        model = transformers.DeepseekV3ForCausalLM(cfg)
    else:
        cfg = transformers.DeepseekV2Config(**BASE, **overrides)
        model = transformers.DeepseekV2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # init std 0.02 gives flat logits: scale up so differences show.
            if p.dim() >= 2:
                p.normal_(0, 0.15 if "embed" not in name else 1.0)
            else:
                p.uniform_(0.5, 1.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.1, 0.1)
    return model.eval()


@pytest.mark.parametrize("gemm", ["blas", "onednn"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, gemm, tmp_path):
    kind, overrides = CASES[case]
    ref = build_reference(kind, overrides)
    ref.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path))
    ids = torch.randint(0, BASE["vocab_size"], (2, 160), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), cpu_gemm(gemm):  # both libraries an fp32 CPU product can run on
        expected = ref(ids).logits
        got = ours(ids)
    assert expected.std() > 0.5, "logits too flat to be a meaningful comparison"
    diff = (expected - got).abs().max().item()
    print(f"{case}: max abs diff {diff:.3e}")
    assert diff <= 1e-4


def test_unsupported_config_names_the_field(tmp_path):
    import json

    ref = build_reference("v3", dict(first_k_dense_replace=3, q_lora_rank=None))
    ref.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedConfig, match="hidden_act"):
        load_model(str(tmp_path))
    cfg["hidden_act"] = "silu"
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedConfig, match="rope type"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("gemm", ["blas", "onednn"])
def test_bf16_linear_without_bf16_instructions_is_a_bf16_gemm_summed_in_fp32(gemm, monkeypatch):
    """The fp32 route of a bf16 Linear (CPUs without bf16 instructions, forced here whatever this CPU
    has): exact operands, fp32 sums, one rounding to bf16 -- and its fp32 weight copy follows
    in-place weight updates."""
    from leyline_runtime.model import layers
    from leyline_runtime.model.layers import Linear

    monkeypatch.setattr(layers, "cpu_has_bf16_matmul", lambda: False)
    gen = torch.Generator().manual_seed(0)
    layer = Linear(256, 96).to(torch.bfloat16)
    x = torch.randn(7, 256, generator=gen).to(torch.bfloat16)
    with torch.no_grad(), cpu_gemm(gemm):
        for _ in range(2):
            ref = (x.double() @ layer.weight.double().T + layer.bias.double()).to(torch.bfloat16)
            out = layer(x)
            assert out.dtype == torch.bfloat16
            assert layer._fp32 is not None  # the fp32 route ran
            # within one bf16 rounding of the exact product (fp32 sums differ only far below bf16's ulp)
            assert torch.allclose(out.double(), ref.double(), rtol=2 ** -7, atol=1e-6)
            assert torch.allclose(out.double(), torch.nn.functional.linear(x, layer.weight, layer.bias).double(),
                                  rtol=2 ** -6, atol=1e-3)
            layer.weight.mul_(-0.5)  # an update in place: the next call must see it
