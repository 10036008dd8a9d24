"""``make gpu-check``'s runtime step: the bundled runtime's forward and directives on a device.

The same agent history goes through two runtimes on the embedded default model, one on the CPU
(the reference) and one on the device under test: the next-token logits after the prefill, after
an amortize (a failed tool attempt dropped: the tail's rows move and rotate through the device's
kernel), after a forget (a message replaced and everything after it recomputed) and after an
``auto`` edit (a tool output replaced; the runtimes are configured to repair whenever the drift
signal is above zero, so the splice, the signal and the tail recompute all run) must match the
CPU's, the device's forget must match a fresh prefill of the same messages, the rows the amortize
left must match the CPU's, and ``auto`` must choose what the CPU chose.

Twice: in fp32, where the two devices differ only by summation order (``DEVICE_TOLERANCE``), and in
bf16, where they may differ by bf16's own rounding: the bar there is the CPU's own bf16 error, twice
the CPU's bf16 walk against its fp32 walk (``BF16_ROUNDING_FACTOR``). Greedy tokens are reported,
not required to match (a near tie may break either way on other hardware).
"""

from __future__ import annotations

import os

import torch

# fp32 sums in another order (GPU vs CPU kernels, chunked vs whole prefills) differ by a few ulps of the
# values summed; measured CPU to CPU, the same comparison is ~1e-6.
DEVICE_TOLERANCE = 1e-3
FRESH_PREFILL_TOLERANCE = 1e-4
# bf16: device vs CPU within this many times the CPU's own bf16-vs-fp32 difference of the same value.
BF16_ROUNDING_FACTOR = 2.0
COMPARED = ("forward", "amortize", "amortize_rows", "forget", "auto")
CACHE_TOKENS = 4096
GREEDY_TOKENS = 8


def fp32_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| in units of the larger magnitude in either (at least 1)."""
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    scale = max(1.0, a.abs().max().item(), b.abs().max().item())
    return (a - b).abs().max().item() / scale


def _history():
    from leyline_sdk.protocol import FunctionCall, Message, ToolCall

    def call(call_id: str, name: str, args: str) -> ToolCall:
        return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=args))

    listing = "\n".join(f"line {i}: value_{i * 7} = {i * i}" for i in range(30))
    return [
        Message(role="system", content="You are a careful agent. Use tools when needed."),
        Message(role="user", content="What is the value of key api_port, plus 17?"),
        Message(role="assistant", content="", tool_calls=[call("c1", "kv_get", '{"key": "api_prt"}')]),
        Message(role="tool", content="Error: KeyError: 'api_prt' not found.", tool_call_id="c1"),
        Message(role="assistant", content="", tool_calls=[call("c2", "kv_get", '{"key": "api_port"}')]),
        Message(role="tool", content="8080", tool_call_id="c2"),
        Message(role="assistant", content="", tool_calls=[call("c3", "read_file", '{"path": "notes.txt"}')]),
        Message(role="tool", content=listing, tool_call_id="c3"),
    ]


def auto_config():
    """Mode auto as the step runs it: repair whenever drift x attention is above zero (and the
    tail is longer than 16 tokens), so an ``auto`` edit exercises the splice, the drift signal and
    the tail recompute."""
    from leyline_runtime.config import AutoConfig

    return AutoConfig(repair_threshold=0.0, short_tail=16)


def auto_edit():
    """The ``auto`` directive of the walk: the tool output "8080" (message 3 once the amortize and the
    forget have run) replaced by a longer one."""
    from leyline_sdk.protocol import Directive, Message, Span

    return Directive(span=Span(start=3, end=4), mode="auto",
                     replacement=[Message(role="tool", content="8080 (http, from config/ports.yaml)",
                                          tool_call_id="c2")])


def _walk(device: str, dtype: str) -> dict:
    """Prefill, amortize, forget, auto and a fresh prefill on one runtime; the tensors to compare."""
    from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate, Span
    from leyline_runtime.inspection import Inspector
    from leyline_runtime.runtime import Runtime, RuntimeConfig

    from ..fidelity.arms import TENANT, greedy_continuation, next_token_logits

    rt = Runtime(RuntimeConfig(device=device, dtype=dtype, max_cache_tokens=CACHE_TOKENS, auto=auto_config()))
    sid = rt.create_session(SessionCreate(messages=_history()), TENANT).session_id
    out = {"device": str(rt.engine.device), "forward": next_token_logits(rt, sid)}
    amortize = Directive(span=Span(start=2, end=4))  # drop the failed attempt: the tail moves up
    out["amortize_mode"] = rt.apply(DirectiveBatch(session_id=sid, directives=[amortize]), TENANT) \
        .outcomes[0].applied_mode
    out["amortize_rows"] = Inspector(rt).cache_rows(sid, TENANT).cpu()
    out["amortize"] = next_token_logits(rt, sid)
    replacement = Message(role="user", content="What is the value of key db_port, plus 3?")
    forget = Directive(span=Span(start=1, end=2), replacement=[replacement], mode="forget")
    out["forget_mode"] = rt.apply(DirectiveBatch(session_id=sid, directives=[forget]), TENANT) \
        .outcomes[0].applied_mode
    out["forget"] = next_token_logits(rt, sid)
    messages, _ = rt.session_messages(sid, TENANT)
    fresh = rt.create_session(SessionCreate(messages=messages), TENANT).session_id
    out["fresh"] = next_token_logits(rt, fresh)
    decision = rt.apply(DirectiveBatch(session_id=sid, directives=[auto_edit()]), TENANT).outcomes[0].auto
    out["auto_choice"], out["auto_layer1_change"] = decision.choice, decision.layer1_change
    out["auto_repaired_tokens"] = decision.repaired_tokens
    out["auto"] = next_token_logits(rt, sid)
    out["greedy"] = greedy_continuation(rt, sid, GREEDY_TOKENS)
    return out


def _compare_fp32(dev: dict, ref: dict) -> tuple[dict, list[str]]:
    diffs = {name: fp32_diff(dev[name], ref[name]) for name in COMPARED}
    problems = [f"fp32 {name} differs from the CPU's by {d:.3g} (> {DEVICE_TOLERANCE})"
                for name, d in diffs.items() if not d <= DEVICE_TOLERANCE]
    return diffs, problems


def _compare_bf16(dev: dict, ref: dict, ref_fp32: dict) -> tuple[dict, dict, list[str]]:
    """Device bf16 vs CPU bf16, each against the bar the CPU's own bf16 rounding sets."""
    diffs = {name: fp32_diff(dev[name], ref[name]) for name in COMPARED}
    bars = {name: BF16_ROUNDING_FACTOR * fp32_diff(ref[name], ref_fp32[name]) for name in COMPARED}
    problems = [f"bf16 {name} differs from the CPU's by {diffs[name]:.3g} (> {bars[name]:.3g}, "
                f"{BF16_ROUNDING_FACTOR:g}x the CPU's own bf16 error)" for name in COMPARED
                if not diffs[name] <= bars[name]]
    return diffs, bars, problems


def _walk_checks(dev: dict, ref: dict, label: str) -> list[str]:
    """What must hold on the device's walk besides the numbers: modes applied and auto's choice."""
    problems = []
    for name, want in (("amortize_mode", "amortize"), ("forget_mode", "forget")):
        if dev[name] != want:
            problems.append(f"{label} {want} was applied as {dev[name]!r}")
    if dev["auto_choice"] != ref["auto_choice"]:
        problems.append(f"{label} auto chose {dev['auto_choice']!r}, the CPU {ref['auto_choice']!r}")
    fresh = fp32_diff(dev["forget"], dev["fresh"])
    tolerance = FRESH_PREFILL_TOLERANCE if label == "fp32" else fp32_diff(ref["forget"], ref["fresh"]) * 2 + 1e-6
    if not fresh <= tolerance:
        problems.append(f"{label} forget differs from a fresh prefill by {fresh:.3g} (> {tolerance:.3g})")
    return problems


def _auto_summary(walk: dict) -> dict:
    return {"choice": walk["auto_choice"], "layer1_change": walk["auto_layer1_change"],
            "repaired_tokens": walk["auto_repaired_tokens"]}


def check(device: str) -> dict:
    """The step's result: ``status`` pass/fail/skip, the measured differences and a reason."""
    try:  # the runtime's own dependencies: a GPU image may lack some of them
        import leyline_runtime.runtime  # noqa: F401
        from ..fidelity import arms  # noqa: F401
    except ModuleNotFoundError as exc:
        return {"status": "skip", "reason": f"the runtime needs the module {exc.name!r}, which is not installed"}
    from leyline_kernels import kernel_backend

    torch.manual_seed(0)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32 products (the default), to compare with the CPU's
    try:
        ref, ref_bf16 = _walk("cpu", "float32"), _walk("cpu", "bfloat16")
        dev, dev_bf16 = _walk(device, "float32"), _walk(device, "bfloat16")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    diffs, problems = _compare_fp32(dev, ref)
    bf16_diffs, bf16_bars, bf16_problems = _compare_bf16(dev_bf16, ref_bf16, ref)
    problems += bf16_problems + _walk_checks(dev, ref, "fp32") + _walk_checks(dev_bf16, ref_bf16, "bf16")
    if ref["auto_choice"] != "repair":
        problems.append(f"auto chose {ref['auto_choice']!r} on the CPU: the walk no longer exercises repair")
    return {"status": "fail" if problems else "pass", "reason": "; ".join(problems) or None,
            "device": dev["device"], "kernel_backend": kernel_backend(device),
            "diff_vs_cpu": diffs, "forget_vs_fresh_prefill": fp32_diff(dev["forget"], dev["fresh"]),
            "bf16": {"diff_vs_cpu": bf16_diffs, "bar": bf16_bars,
                     "forget_vs_fresh_prefill": fp32_diff(dev_bf16["forget"], dev_bf16["fresh"])},
            "tolerances": {"vs_cpu": DEVICE_TOLERANCE, "vs_fresh_prefill": FRESH_PREFILL_TOLERANCE,
                           "bf16_rounding_factor": BF16_ROUNDING_FACTOR},
            "applied_modes": [dev["amortize_mode"], dev["forget_mode"], "auto"],
            "auto": {"device": _auto_summary(dev), "cpu": _auto_summary(ref),
                     "device_bf16": _auto_summary(dev_bf16), "cpu_bf16": _auto_summary(ref_bf16)},
            "greedy_tokens_equal_cpu": dev["greedy"] == ref["greedy"],
            "greedy_tokens_equal_cpu_bf16": dev_bf16["greedy"] == ref_bf16["greedy"],
            "tf32_env_override": os.environ.get("NVIDIA_TF32_OVERRIDE")}
