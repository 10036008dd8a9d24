"""fp32 CPU products on either library (torch's BLAS or oneDNN): the same results to rounding, the row
property batch-invariant mode rests on, training untouched, and how ``auto`` chooses."""

from __future__ import annotations

import pytest
import torch

from leyline_runtime.model import layers
from leyline_runtime.model.layers import Linear
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_sdk.protocol import GenerateRequest, SessionCreate

from helpers import agent_history, cpu_gemm, fp32_diff

GEMMS = ["blas", "onednn"]


def exact(x: torch.Tensor, layer: Linear) -> torch.Tensor:
    return x.double() @ layer.weight.double().T + layer.bias.double()


@pytest.mark.parametrize("gemm", GEMMS)
def test_product_is_the_fp32_product(gemm):
    gen = torch.Generator().manual_seed(0)
    layer = Linear(384, 1024)
    for rows in (1, 3, 16, 257):
        x = torch.randn(rows, 384, generator=gen)
        with torch.no_grad(), cpu_gemm(gemm):
            out = layer(x)
        assert out.dtype == torch.float32 and out.shape == (rows, 1024)
        # a few fp32 ulps of the terms summed (384 of them, each |x w| ~ 1e-1)
        assert (out.double() - exact(x, layer)).abs().max().item() <= 1e-5


def test_a_rows_result_on_onednn_does_not_depend_on_the_row_count():
    """What batch-invariant mode (products padded to INVARIANT_ROWS, on oneDNN) rests on. MKL has no
    such property everywhere: on an Intel Xeon at 2 threads its rows of ``down_proj``'s shape
    (1024 -> 384) move from 57 rows on, so the mode does not use it."""
    gen = torch.Generator().manual_seed(1)
    for d_in, d_out in ((384, 384), (384, 1024), (1024, 384), (384, 8192)):
        layer = Linear(d_in, d_out, bias=False)
        x = torch.randn(600, d_in, generator=gen)
        with torch.no_grad(), cpu_gemm("onednn"):
            first = layer(x[: layers.INVARIANT_ROWS])
            for rows in (17, 64, 600):
                assert torch.equal(layer(x[:rows])[: layers.INVARIANT_ROWS], first), (d_in, d_out, rows)


@pytest.mark.parametrize("gemm", GEMMS)
def test_batch_invariant_products_run_on_onednn_whatever_the_setting(gemm):
    gen = torch.Generator().manual_seed(3)
    layer = Linear(1024, 384)
    x = torch.randn(600, 1024, generator=gen)
    with torch.no_grad(), cpu_gemm(gemm), layers.invariant_products():
        for rows in (1, 16, 600):
            expected = layers.onednn_linear(layers.padded_rows(x[:rows], layers.INVARIANT_ROWS), layer.weight,
                                            layer.bias)[:rows]
            assert torch.equal(layer(x[:rows]), expected), rows


def test_training_keeps_autograd_linear_whatever_the_library():
    gen = torch.Generator().manual_seed(2)
    layer = Linear(8, 4)
    x = torch.randn(5, 8, generator=gen, requires_grad=True)
    with cpu_gemm("onednn"):
        layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    # d(sum)/dW is every row of x summed; the backward sums in its own order, so a column summing to
    # ~0 differs from this sum by fp32 rounding of its terms (~1e-7), not relative to its tiny result
    expected = x.detach().double().sum(0).expand(4, 8)
    assert (layer.weight.grad.double() - expected).abs().max().item() <= 1e-6


def test_fp32_linear_keeps_autograd_where_a_gradient_is_needed():
    # the MoE router calls fp32_linear directly; oneDNN's operator has no backward
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
    with cpu_gemm("onednn"), layers.invariant_products():
        layers.fp32_linear(torch.ones(2, 8), w).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.full((4, 8), 2.0))


def test_greedy_generation_agrees_across_libraries():
    """The served model on both libraries: the same greedy tokens, logprobs equal to rounding."""
    rt = Runtime(RuntimeConfig(max_cache_tokens=8192))
    results = {}
    for gemm in GEMMS:
        with cpu_gemm(gemm):
            sid = rt.create_session(SessionCreate(messages=agent_history())).session_id
            results[gemm] = rt.generate(sid, GenerateRequest(max_tokens=12, temperature=0.0, logprobs=True))
            rt.delete_session(sid)
    blas, onednn = results["blas"], results["onednn"]
    assert [t.token for t in blas.logprobs] == [t.token for t in onednn.logprobs]
    lp = [torch.tensor([t.logprob for t in r.logprobs]) for r in (blas, onednn)]
    assert fp32_diff(*lp) <= 1e-4


def test_batch_invariant_mode_takes_onednn_where_torch_has_it(monkeypatch):
    with cpu_gemm("blas"):
        assert layers.linear_library(False) == "blas" and layers.linear_library(True) == "onednn"
        monkeypatch.setattr(layers, "onednn_available", lambda: False)  # a torch built without oneDNN
        assert layers.linear_library(True) == "blas"


def test_unknown_library_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="cpu_gemm"):
        layers.set_cpu_gemm("openblas")
    monkeypatch.setattr(layers, "onednn_available", lambda: False)  # a torch built without oneDNN
    with pytest.raises(ValueError, match="no oneDNN"):
        layers.set_cpu_gemm("onednn")
    assert layers.cpu_gemm_setting() == "auto"


@pytest.mark.parametrize(("vendor", "expected"), [("GenuineIntel", "blas"), ("AuthenticAMD", "onednn"),
                                                  ("", "onednn")])
def test_auto_keeps_mkl_on_intel_only(monkeypatch, vendor, expected):
    monkeypatch.setattr(layers, "cpu_vendor", lambda: vendor)
    assert layers.auto_cpu_gemm.__wrapped__() == expected
    monkeypatch.setattr(layers, "onednn_available", lambda: False)
    assert layers.auto_cpu_gemm.__wrapped__() == "blas"


@pytest.mark.skipif(not layers.cpu_has_bf16_matmul() or not layers.onednn_available(),
                    reason="bf16 products on a packed weight need a CPU with bf16 instructions and oneDNN")
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_products_on_a_packed_weight_equal_f_linear(bias):
    gen = torch.Generator().manual_seed(4)
    layer = Linear(384, 1024, bias=bias).to(torch.bfloat16)
    x = torch.randn(3, 300, 384, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            for rows in (1, 16, 300):
                assert torch.equal(layer(x[0, :rows]), torch.nn.functional.linear(x[0, :rows], layer.weight, layer.bias))
            assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
            assert layer._packed is not None  # the packed route ran
            layer.weight.mul_(-0.5)  # an update in place: the next call must see it


def test_bf16_rows_in_batch_invariant_mode_do_not_depend_on_the_row_count():
    """Batch-invariant mode runs bf16 products as fp32 ones on oneDNN: with AMX, oneDNN's native bf16
    rows of down_proj's shape move at 56-128 rows for about half of random inputs."""
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        layer = Linear(1024, 384, bias=False).to(torch.bfloat16)
        x = torch.randn(300, 1024, generator=gen).to(torch.bfloat16)
        with torch.no_grad(), layers.invariant_products():
            first = layer(x[:layers.INVARIANT_ROWS])
            for rows in (17, 56, 57, 64, 128, 300):
                assert torch.equal(layer(x[:rows])[:layers.INVARIANT_ROWS], first), (seed, rows)


def test_cached_weight_copies_follow_a_replaced_weight_and_a_move():
    """The fp32 / packed copies are keyed to the weight object, not only its address (a replaced
    weight's memory may be reused), and dropped by .to()."""
    gen = torch.Generator().manual_seed(5)
    layer = Linear(64, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)

    def weight():
        return torch.nn.Parameter(torch.randn(32, 64, generator=gen).to(torch.bfloat16), requires_grad=False)

    with torch.no_grad():
        for _ in range(6):
            layer.weight = weight()
            layer(x)  # cached for this weight
            layer.weight = weight()
            layer.weight = weight()  # may reuse the memory of the first, freed by the second (version 0 too)
            expected = (x.double() @ layer.weight.double().T)
            assert (layer(x).double() - expected).abs().max().item() <= 0.05 * expected.abs().max().item()
        kept = layer.weight  # a replaced weight still alive elsewhere: compared by identity, not by value
        layer.weight = weight()
        expected = (x.double() @ layer.weight.double().T)
        assert (layer(x).double() - expected).abs().max().item() <= 0.05 * expected.abs().max().item()
        assert kept is not layer.weight
        assert layer._fp32 is not None or layer._packed is not None
        layer.to(torch.float32)
        assert layer._fp32 is None and layer._packed is None
        assert torch.equal(layer(x.float()), torch.nn.functional.linear(x.float(), layer.weight))
