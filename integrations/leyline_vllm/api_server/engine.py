"""One prompt through vLLM's engine client, with Leyline's connector params.

The connector reports on a request when vLLM's scheduler finishes it (:mod:`leyline_vllm.kv.wire`). A
request that ends on a stop string is finished by vLLM's frontend instead: its detokenizer finds the
string, hands back the final output at once, and aborts the request in the engine, so that output
carries no connector report (vLLM's ``OutputProcessor``). Its rows are still held (the scheduler side
holds an aborted request that computed its prompt, and the abort reaches the engine before any later
request of ours), so the report is rebuilt from what the API server knows: vLLM's own count of the
prompt tokens it did not compute, the key the rows are held under, and the rows that exist (the prompt
and every generated token but the last). Any other finished request without a report is named.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ..kv.wire import PARAMS_KEY, LoadReport


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
    stop_reason: str | int | None = None  # vLLM's: the stop string (or stop token id) that ended the reply

    @property
    def computed(self) -> int:
        """Prompt tokens vLLM computed for this request."""
        if not self.planned:  # only vLLM's own prefix cache could supply rows
            return self.prompt_len - self.num_cached_tokens
        # after a failed load the connector reports loaded=0; after a released hold, the part it did load
        return self.prompt_len - (self.report.local_hit + self.report.loaded)


def _report(final, completion, kv_params: dict, prompt_len: int, cached: int) -> LoadReport:
    """The connector's report on ``final``, or (where vLLM's frontend finished it) the one rebuilt;
    ``cached``: vLLM's count of the prompt tokens it did not compute (its prefix cache and the load)."""
    if not kv_params or (final.kv_transfer_params or {}).get(PARAMS_KEY):
        return LoadReport.from_output(final.kv_transfer_params)
    generated = len(completion.token_ids)
    if completion.finish_reason == "stop" and isinstance(completion.stop_reason, str):
        save = kv_params["kv_transfer_params"][PARAMS_KEY].get("save")
        return LoadReport(local_hit=cached, saved=save, saved_tokens=prompt_len + max(0, generated - 1) if save else 0)
    return LoadReport(local_hit=cached, fallback=f"report_missing: vLLM finished the request "
                                                 f"({completion.finish_reason}) without the connector's report")


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
    cached = final.num_cached_tokens or 0
    return EngineResult(
        token_ids=list(completion.token_ids), text=completion.text, finish_reason=completion.finish_reason,
        prompt_len=len(prompt_ids), num_cached_tokens=cached,
        report=_report(final, completion, kv_params, len(prompt_ids), cached), logprobs=completion.logprobs,
        planned=bool(kv_params), stop_reason=completion.stop_reason)
