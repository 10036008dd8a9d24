"""Shared test fixtures: small histories in the runtime's chat template."""

from contextlib import contextmanager

from leyline_sdk.protocol import FunctionCall, Message, ToolCall


def call(call_id: str, name: str, args: str) -> ToolCall:
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=args))


def agent_history(long_output_lines: int = 30) -> list[Message]:
    listing = "\n".join(f"line {i}: value_{i * 7} = {i * i}" for i in range(long_output_lines))
    return [
        Message(role="system", content="You are a careful agent. Use tools when needed."),
        Message(role="user", content="What is the value of key api_port, plus 17?"),
        Message(role="assistant", content="", tool_calls=[call("c1", "kv_get", '{"key": "api_prt"}')]),
        Message(role="tool", content="Error: KeyError: 'api_prt' not found. Did you mean 'api_port'?",
                tool_call_id="c1"),
        Message(role="assistant", content="", tool_calls=[call("c2", "kv_get", '{"key": "api_port"}')]),
        Message(role="tool", content="8080", tool_call_id="c2"),
        Message(role="assistant", content="", tool_calls=[call("c3", "read_file", '{"path": "notes.txt"}')]),
        Message(role="tool", content=listing, tool_call_id="c3"),
        Message(role="assistant", content="", tool_calls=[call("c4", "calculator",
                                                                 '{"expression": "8080 + 17"}')]),
        Message(role="tool", content="8097", tool_call_id="c4"),
    ]


def fp32_diff(a, b) -> float:
    """Max |a - b| in units of the larger magnitude in either (at least 1).

    The same fp32 sums in another order (chunked vs whole prefill, batched vs solo decode) differ by a
    few ulps of the values summed, so the bound scales with them: a sharper model has larger logits
    and latent rows, and the same relative error is a larger absolute one.
    """
    scale = max(1.0, a.abs().max().item(), b.abs().max().item())
    return (a - b).abs().max().item() / scale


@contextmanager
def cpu_gemm(choice: str):
    """fp32 CPU products on ``choice`` ("blas" / "onednn") within the block (a process setting)."""
    from leyline_runtime.model import layers

    before = layers.cpu_gemm_setting()
    layers.set_cpu_gemm(choice)
    try:
        yield
    finally:
        layers.set_cpu_gemm(before)
