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
from server_support import default_model_and_tokenizer, torch_threads

from leyline_runtime import create_app
from leyline_runtime.model import MLAConfig, seeded_model
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.server.limits import Limits
from leyline_sdk.protocol import Message, SessionCreate


def tiny_runtime() -> Runtime:
    _, tokenizer = default_model_and_tokenizer()
    cfg = MLAConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                    v_head_dim=16, max_position_embeddings=64, tie_word_embeddings=True)
    return Runtime(RuntimeConfig(max_cache_tokens=1024), model=seeded_model(cfg), tokenizer=tokenizer)


OPERATIONS = [("/sessions", "POST"), ("/sessions", "GET"), ("/sessions/{session_id}", "GET"),
              ("/sessions/{session_id}", "DELETE"), ("/sessions/{session_id}/messages", "POST"),
              ("/sessions/{session_id}/generate", "POST"), ("/directives", "POST"),
              ("/v1/chat/completions", "POST"), ("/v1/models", "GET"), ("/v1/messages", "POST"),
              ("/v1/messages/count_tokens", "POST"), ("/healthz", "GET"), ("/metrics", "GET")]


# Small limits, so that generated requests also run into them (413 request_too_large).
LIMITS = Limits(max_body_bytes=32 * 1024, max_message_bytes=2048, max_messages=8, body_timeout=5)
VICTIM = "victim"
# Every documented native error code (docs/operations.md).
DOCUMENTED_CODES = {"invalid_body", "unauthorized", "session_not_found", "not_found", "method_not_allowed",
                    "request_timeout", "version_conflict", "session_exists", "request_too_large", "capacity_exceeded",
                    "validation_error", "invalid_span", "overlapping_spans", "invalid_directive", "invalid_request"}


@pytest.fixture(scope="module")
def runtime():
    with torch_threads(1):
        yield tiny_runtime()


@pytest.fixture(scope="module")
def api_schema(runtime):
    yield schemathesis.openapi.from_asgi("/openapi.json", create_app(runtime=runtime, limits=LIMITS))


def ensure_victim(runtime: Runtime) -> None:
    """A live session for the generated requests to hit (DELETE cases drop it; eviction too)."""
    if not runtime.has_session(VICTIM):
        runtime.create_session(SessionCreate(session_id=VICTIM, messages=[
            Message(role="system", content="short"), Message(role="user", content="hi there")]))


def test_the_schema_lists_every_operation(api_schema):
    listed = {(op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations()}
    assert listed == set(OPERATIONS)


# Operations without parameters or body have no invalid input to generate.
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
CASES = [(path, method, mode) for path, method in OPERATIONS for mode in MODES
         if mode is GenerationMode.POSITIVE or "{" in path or method == "POST"]


# Operations on one session also run against a live one (generated ids almost never exist).
BOUND = [(path, method, mode, bound) for path, method, mode in CASES
         for bound in ((False, True) if "{session_id}" in path else (False,))]


@pytest.mark.parametrize("path,method,mode,bound", BOUND, ids=lambda v: getattr(v, "value", v))
def test_no_input_produces_a_server_error(api_schema, runtime, path, method, mode, bound):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=12, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        if bound:
            ensure_victim(runtime)
            case.path_parameters = {**(case.path_parameters or {}), "session_id": VICTIM}
        response = case.call()
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
        if response.status_code >= 400:
            body = response.json()
            if path.startswith("/v1/messages"):  # Anthropic's error shape
                assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}, body
                assert body["error"]["message"], body
                return
            # OpenAI's error shape on /v1, the native one (with a documented code) elsewhere
            fields = {"message", "type", "param", "code"} if path.startswith("/v1/") else {"code", "message"}
            assert set(body) == {"error"} and set(body["error"]) == fields, body
            if not path.startswith("/v1/"):
                assert body["error"]["code"] in DOCUMENTED_CODES, body
            assert body["error"]["message"], body

    check()
