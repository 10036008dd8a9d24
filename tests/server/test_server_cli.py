"""A real ``leyline-runtime serve`` process, driven by the official ``openai`` client."""

from __future__ import annotations

import openai
import pytest
from served_runtime import API_KEY, server, scrape  # noqa: F401 - server is a fixture
from server_support import history, metric

from leyline_runtime import cli
from leyline_runtime.model.layers import cpu_gemm


def test_help_is_true(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--model", "--dtype", "--max-cache-tokens", "--api-key"):
        assert flag in out
    args = cli.build_parser().parse_args(["serve", "--api-key", "a", "b", "--api-key", "c"])
    assert args.api_keys == ["a", "b", "c"] and args.port == 8000 and args.model is None


def test_openai_client_against_a_real_server(server):
    base_url, log_path = server
    startup = log_path.read_text()
    assert "embedded default" in startup and "parameters" in startup and "listening on" in startup
    assert f"fp32 products on {cpu_gemm()} (--cpu-gemm auto" in startup

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == ["leyline-default"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0).models.list()

    # Streaming, stateless.
    stream = client.chat.completions.create(model="leyline-default", messages=history(2), max_tokens=4,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 4
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)

    # Non-streaming, bound to a session: build it, then extend it.
    session = {"session_id": "openai-cli"}
    msgs = history(8)
    first = client.chat.completions.create(model="leyline-default", messages=msgs, max_tokens=3,
                                           temperature=0, extra_body=session)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    msgs = [*msgs, {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "go on"}]
    second = client.chat.completions.create(model="leyline-default", messages=msgs, max_tokens=3,
                                            temperature=0, extra_body=session)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens

    # Delete a middle message and resend: spliced (rotated), not rebuilt.
    before = scrape(base_url)
    msgs = [*msgs[:3], *msgs[4:], {"role": "assistant", "content": second.choices[0].message.content},
            {"role": "user", "content": "last"}]
    third = client.chat.completions.create(model="leyline-default", messages=msgs, max_tokens=3,
                                           temperature=0, extra_body=session)
    after = scrape(base_url)
    report = third.model_extra["leyline"]
    assert report["rebuilt"] is False and report["directives_applied"] == 1
    cached = third.usage.prompt_tokens_details.cached_tokens
    assert cached > 0.8 * third.usage.prompt_tokens
    rotated = (metric(after, "leyline_prompt_tokens_rotated_total")
               - metric(before, "leyline_prompt_tokens_rotated_total"))
    assert rotated == report["outcomes"][0]["rotated_tokens"] > 0
    prefilled = (metric(after, "leyline_prompt_tokens_prefilled_total")
                 - metric(before, "leyline_prompt_tokens_prefilled_total"))
    assert prefilled < third.usage.prompt_tokens - cached + 5  # only the new turn, not the whole history
    assert metric(after, "leyline_directives_total", requested_mode="amortize", applied_mode="amortize") == 1
