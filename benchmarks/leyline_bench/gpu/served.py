"""``make gpu-check``'s served step: one agent session served over HTTP, on the device and on the CPU.

The runtime's app (``leyline_runtime.server.create_app``) runs under uvicorn in this process
(:func:`~leyline_bench.common.inproc.serve_in_thread`), once on the CPU and once on the device, and the
SDK's :class:`~leyline_sdk.LeylineClient` walks the same session through both: create it with the
runtime step's history, apply its amortize, forget and ``auto`` edits (one batch each, as an agent
sends them), then generate greedy tokens with their logprobs. The device must apply what the CPU
applied (modes and ``auto``'s choice), generate the same tokens, and their logprobs must agree
within :data:`LOGPROB_TOLERANCE` (fp32 on both; the difference is summation order).
"""

from __future__ import annotations

import torch

# nats; fp32 logprobs of a ~10M-parameter model differ by ~1e-5 between summation orders.
LOGPROB_TOLERANCE = 1e-3
GENERATED_TOKENS = 8
CACHE_TOKENS = 4096


def _serve_walk(device: str) -> dict:
    from leyline_sdk import LeylineClient
    from leyline_sdk.protocol import Directive, Message, Span
    from leyline_runtime.runtime import RuntimeConfig

    from .runtime import _history, auto_config, auto_edit
    from ..common.inproc import serve_in_thread

    config = RuntimeConfig(device=device, max_cache_tokens=CACHE_TOKENS, auto=auto_config())
    with serve_in_thread(config) as url, LeylineClient(url, max_retries=0) as client:
        health = client.health()
        sid = client.create_session(_history()).session_id
        batches = [[Directive(span=Span(start=2, end=4))],
                   [Directive(span=Span(start=1, end=2), mode="forget",
                              replacement=[Message(role="user", content="What is the value of key db_port, plus 3?")])],
                   [auto_edit()]]
        outcomes = [client.apply(sid, batch).outcomes[0] for batch in batches]
        reply = client.generate(sid, max_tokens=GENERATED_TOKENS, temperature=0.0, logprobs=True)
    return {"health": health,
            "applied": [o.applied_mode for o in outcomes],
            "auto_choice": outcomes[2].auto.choice if outcomes[2].auto else None,
            "tokens": [t.token for t in reply.logprobs or []],
            "logprobs": [t.logprob for t in reply.logprobs or []], "text": reply.message.content}


def check(device: str) -> dict:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401

        import leyline_runtime.server  # noqa: F401
    except ModuleNotFoundError as exc:
        return {"status": "skip", "reason": f"serving needs the module {exc.name!r}, which is not installed"}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref, dev = _serve_walk("cpu"), _serve_walk(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    problems = []
    if dev["applied"] != ref["applied"] or dev["auto_choice"] != ref["auto_choice"]:
        problems.append(f"applied {dev['applied']} (auto {dev['auto_choice']}), the CPU {ref['applied']} "
                        f"(auto {ref['auto_choice']})")
    if dev["tokens"] != ref["tokens"]:
        problems.append(f"generated {dev['tokens']}, the CPU {ref['tokens']}")
    gap = max((abs(a - b) for a, b in zip(dev["logprobs"], ref["logprobs"])), default=float("nan"))
    if not gap <= LOGPROB_TOLERANCE:
        problems.append(f"logprobs differ from the CPU's by {gap:.3g} (> {LOGPROB_TOLERANCE})")
    return {"status": "fail" if problems else "pass", "reason": "; ".join(problems) or None,
            "device": dev, "cpu": ref, "max_logprob_diff": gap, "tolerance": LOGPROB_TOLERANCE}
