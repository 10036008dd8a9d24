"""One prompt through vLLM's engine client, with Leyline's connector params."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ..kv.wire import LoadReport


@dataclass
class EngineResult:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_len: int
    num_cached_tokens: int  # vLLM's count: its prefix cache + the connector's load
    report: LoadReport  # all zero for a request without a row plan
    logprobs: list | None  # vLLM's per-token {token_id: Logprob}
    planned: bool = True  # the request carried a row plan (the connector reports on it)

    @property
    def computed(self) -> int:
        """Prompt tokens vLLM computed for this request."""
        if not self.planned:  # only vLLM's own prefix cache could supply rows
            return self.prompt_len - self.num_cached_tokens
        # after a failed load the connector reports loaded=0; after a released hold, the part it did load
        return self.prompt_len - (self.report.local_hit + self.report.loaded)


async def run_prompt(engine_client, prompt_ids: list[int], sampling: dict, kv_params: dict,
                     cache_salt: str | None) -> EngineResult:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(**sampling, extra_args=kv_params or None)
    prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
    if cache_salt:
        prompt["cache_salt"] = cache_salt
    final = None
    async for out in engine_client.generate(prompt, params, request_id=f"leyline-{uuid.uuid4().hex}"):
        final = out
    completion = final.outputs[0]
    return EngineResult(
        token_ids=list(completion.token_ids), text=completion.text, finish_reason=completion.finish_reason,
        prompt_len=len(prompt_ids), num_cached_tokens=final.num_cached_tokens or 0,
        report=LoadReport.from_output(final.kv_transfer_params), logprobs=completion.logprobs,
        planned=bool(kv_params))
