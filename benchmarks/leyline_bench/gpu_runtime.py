"""``make gpu-check``'s runtime step: the bundled runtime's forward and directives on a device.

The same agent history goes through two runtimes on the embedded default model, one on the CPU
(the reference) and one on the device under test: the next-token logits after the prefill, after
an amortize (a failed tool attempt dropped: the tail's rows move and rotate through the device's
kernel) and after a forget (a message replaced and everything after it recomputed) must match the
CPU's, the device's forget must match a fresh prefill of the same messages, and the rows the
amortize left must match the CPU's. Greedy tokens are reported, not required to match (a near tie
may break either way on other hardware).
"""

from __future__ import annotations

import os

import torch

# fp32 sums in another order (GPU vs CPU kernels, chunked vs whole prefills) differ by a few ulps of the
# values summed; measured CPU to CPU, the same comparison is ~1e-6.
DEVICE_TOLERANCE = 1e-3
FRESH_PREFILL_TOLERANCE = 1e-4
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


def _walk(device: str) -> dict:
    """Prefill, amortize, forget and a fresh prefill on one runtime; the tensors to compare."""
    from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate, Span
    from leyline_runtime.runtime import Runtime, RuntimeConfig

    from .arms import TENANT, greedy_continuation, next_token_logits

    rt = Runtime(RuntimeConfig(device=device, max_cache_tokens=CACHE_TOKENS))
    sid = rt.create_session(SessionCreate(messages=_history()), TENANT).session_id
    out = {"device": str(rt.engine.device), "forward": next_token_logits(rt, sid)}
    amortize = Directive(span=Span(start=2, end=4))  # drop the failed attempt: the tail moves up
    out["amortize_mode"] = rt.apply(DirectiveBatch(session_id=sid, directives=[amortize]), TENANT) \
        .outcomes[0].applied_mode
    session = rt._sessions[(TENANT, sid)]
    out["amortize_rows"] = rt.pool.rows[:, session.table.rows(0, session.num_tokens)].cpu()
    out["amortize"] = next_token_logits(rt, sid)
    replacement = Message(role="user", content="What is the value of key db_port, plus 3?")
    forget = Directive(span=Span(start=1, end=2), replacement=[replacement], mode="forget")
    out["forget_mode"] = rt.apply(DirectiveBatch(session_id=sid, directives=[forget]), TENANT) \
        .outcomes[0].applied_mode
    out["forget"] = next_token_logits(rt, sid)
    messages = list(rt._sessions[(TENANT, sid)].messages)
    fresh = rt.create_session(SessionCreate(messages=messages), TENANT).session_id
    out["fresh"] = next_token_logits(rt, fresh)
    out["greedy"] = greedy_continuation(rt, sid, GREEDY_TOKENS)
    return out


def check(device: str) -> dict:
    """The step's result: ``status`` pass/fail/skip, the measured differences and a reason."""
    try:  # the runtime's own dependencies: a GPU image may lack some of them
        import leyline_runtime.runtime  # noqa: F401
        from . import arms  # noqa: F401
    except ModuleNotFoundError as exc:
        return {"status": "skip", "reason": f"the runtime needs the module {exc.name!r}, which is not installed"}
    from leyline_kernels import kernel_backend

    torch.manual_seed(0)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32 products (the default), to compare with the CPU's
    try:
        ref = _walk("cpu")
        dev = _walk(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    diffs = {name: fp32_diff(dev[name], ref[name]) for name in ("forward", "amortize", "amortize_rows", "forget")}
    fresh = fp32_diff(dev["forget"], dev["fresh"])
    problems = [f"{name} differs from the CPU's by {d:.3g} (> {DEVICE_TOLERANCE})"
                for name, d in diffs.items() if not d <= DEVICE_TOLERANCE]
    if not fresh <= FRESH_PREFILL_TOLERANCE:
        problems.append(f"forget differs from a fresh prefill by {fresh:.3g} (> {FRESH_PREFILL_TOLERANCE})")
    for name, want in (("amortize_mode", "amortize"), ("forget_mode", "forget")):
        if dev[name] != want:
            problems.append(f"{want} was applied as {dev[name]!r}")
    return {"status": "fail" if problems else "pass", "reason": "; ".join(problems) or None,
            "device": dev["device"], "kernel_backend": kernel_backend(device),
            "diff_vs_cpu": diffs, "forget_vs_fresh_prefill": fresh,
            "tolerances": {"vs_cpu": DEVICE_TOLERANCE, "vs_fresh_prefill": FRESH_PREFILL_TOLERANCE},
            "applied_modes": [dev["amortize_mode"], dev["forget_mode"]],
            "greedy_tokens_equal_cpu": dev["greedy"] == ref["greedy"],
            "tf32_env_override": os.environ.get("NVIDIA_TF32_OVERRIDE")}
