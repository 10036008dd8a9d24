"""Sampling parameters into vLLM's form, and vLLM's logprobs back into Leyline's."""

from __future__ import annotations

from leyline_sdk.protocol import GenerateRequest, TokenLogprob, TopLogprob

from .engine import EngineResult

# vLLM 0.32 on CPU rewinds a seeded request's generator when a step discards its sampled token (a prompt
# split across steps by chunked prefill), which CPU generators cannot do: the engine dies ("CPU Generator
# does not use offset") and the server with it. Seen on plain vLLM's /v1/completions, a 3,500-token
# seeded prompt (2-core AMX Xeon, MLA with chunked prefill). Any prompt may be split under load.
SEED_ON_CPU = ("not served here: vLLM's CPU backend with chunked prefill crashes its engine on a seeded "
               "request whose prompt is split across steps; leave seed out (or serve with chunked prefill off)")


def refused_sampling(vllm_config) -> dict[str, str]:
    """The sampling fields this server refuses on Leyline's routes, with why (field -> reason)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and vllm_config.scheduler_config.enable_chunked_prefill:
        return {"seed": SEED_ON_CPU}
    return {}


def vllm_sampling(body: GenerateRequest, max_tokens: int) -> dict:
    out = {"max_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p,
           "top_k": body.top_k or 0, "seed": body.seed, "stop": body.stop_strings() or None,
           "min_tokens": min(body.min_tokens, max_tokens)}
    if body.logprobs:
        out["logprobs"] = max(1, body.top_logprobs)
    return out


def token_logprobs(result: EngineResult, top_k: int) -> list[TokenLogprob]:
    out = []
    for token_id, options in zip(result.token_ids, result.logprobs or []):
        chosen = options[token_id]
        ranked = sorted(options.values(), key=lambda lp: lp.rank)
        top = [TopLogprob(token=lp.decoded_token or "", logprob=lp.logprob,
                          bytes=list((lp.decoded_token or "").encode())) for lp in ranked[:top_k]]
        out.append(TokenLogprob(token=chosen.decoded_token or "", logprob=chosen.logprob,
                                bytes=list((chosen.decoded_token or "").encode()), top_logprobs=top))
    return out
