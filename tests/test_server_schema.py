"""Schemathesis against the app's own OpenAPI schema: no input may produce a 5xx.

A tiny seeded model (same tokenizer, 1 layer, 64 positions) stands in for
the default one so that generated requests asking for thousands of tokens
stay cheap; the HTTP layer and the runtime around it are the real ones.
Bounded and derandomized so it is quick and repeatable.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from test_server_support import default_model_and_tokenizer, torch_threads

from leyline_runtime import create_app
from leyline_runtime.model import MLAConfig, seeded_model
from leyline_runtime.runtime import Runtime, RuntimeConfig


def tiny_runtime() -> Runtime:
    _, tokenizer = default_model_and_tokenizer()
    cfg = MLAConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                    v_head_dim=16, max_position_embeddings=64, tie_word_embeddings=True)
    return Runtime(RuntimeConfig(max_cache_tokens=1024), model=seeded_model(cfg), tokenizer=tokenizer)


OPERATIONS = [("/sessions", "POST"), ("/sessions", "GET"), ("/sessions/{session_id}", "GET"),
              ("/sessions/{session_id}", "DELETE"), ("/sessions/{session_id}/messages", "POST"),
              ("/sessions/{session_id}/generate", "POST"), ("/directives", "POST"),
              ("/v1/chat/completions", "POST"), ("/v1/models", "GET"), ("/healthz", "GET"), ("/metrics", "GET")]


@pytest.fixture(scope="module")
def api_schema():
    with torch_threads(1):
        yield schemathesis.openapi.from_asgi("/openapi.json", create_app(runtime=tiny_runtime()))


def test_the_schema_lists_every_operation(api_schema):
    listed = {(op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations()}
    assert listed == set(OPERATIONS)


# Operations without parameters or body have no invalid input to generate.
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
CASES = [(path, method, mode) for path, method in OPERATIONS for mode in MODES
         if mode is GenerationMode.POSITIVE or "{" in path or method == "POST"]


@pytest.mark.parametrize("path,method,mode", CASES, ids=lambda v: getattr(v, "value", v))
def test_no_input_produces_a_server_error(api_schema, path, method, mode):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=8, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call()
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
        if response.status_code >= 400 and response.status_code != 405:
            body = response.json()
            # OpenAI's error shape on /v1, the native one elsewhere
            fields = {"message", "type", "param", "code"} if path.startswith("/v1/") else {"code", "message"}
            assert set(body) == {"error"} and set(body["error"]) == fields, body

    check()
