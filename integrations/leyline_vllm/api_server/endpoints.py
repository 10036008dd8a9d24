"""``vllm.endpoint_plugins`` entry: Leyline's REST surface for sessions on ``vllm serve``.

The session routes are the bundled runtime's own (``leyline_runtime.api.sessions``,
torch-free, served here by :class:`VllmSessions`), so
``leyline_sdk.LeylineClient`` / ``LeylineMemory`` work unchanged:
``/sessions`` (create, list, get, delete, ``/messages``, ``/generate``),
``POST /directives``, ``GET /healthz``, and ``POST /v1/chat/completions``
bound to a session (``session_id`` in the body or ``X-Leyline-Session``):
the batch is planned against the session's history (``leyline_sdk.batch_plan``,
as the SDK and the bundled runtime plan it), applied, then the reply generated, with
``usage.prompt_tokens_details.cached_tokens`` and the ``leyline`` report.
A chat request without a session goes to vLLM's own handler unchanged.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from leyline_runtime.api.errors import LeylineErrorRoute
from leyline_runtime.api.sessions import build_session_router
from leyline_sdk.errors import LeylineError, ValidationFailed
from leyline_sdk.protocol import (
    MAX_ID_LENGTH,
    REBUILD_HEADER,
    SESSION_HEADER,
    AppendRequest,
    AppendResult,
    DirectiveBatch,
    DirectiveResult,
    GenerateRequest,
    GenerateResponse,
    Message,
    Mode,
    SessionCreate,
    SessionInfo,
)
from leyline_sdk.tools_prompt import TOOL_CALL, tools_message

from .auto_edits import AutoRule, auto_config_from_env
from .metrics import register_collector
from .service import LeylineService
from .template import ChatRenderer

# Exposes a session's saved KV rows over HTTP: for the plugin's own tests and diagnostics only.
DEBUG_ROUTES_ENV = "LEYLINE_VLLM_DEBUG_ROUTES"
DEFAULT_MAX_TOKENS = 256


class LeylineOptions(BaseModel):
    mode: Mode = "amortize"


class BoundChatRequest(BaseModel):
    """The OpenAI chat fields a session-bound request honours (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    messages: list[Message] = Field(min_length=1)
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    leyline: LeylineOptions | None = None
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None


def _events_in_one_piece(response: GenerateResponse) -> list[str]:
    """A streamed generate's events (``delta``, then ``done``), sent once the reply is whole."""
    events = [{"type": "delta", "content": response.message.content}] if response.message.content else []
    events.append({"type": "done", "response": response.model_dump(mode="json")})
    return [f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events]


def _parse(model: type[BaseModel], raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ValidationFailed(str(exc.errors(include_url=False, include_context=False))) from exc


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"the body is not JSON: {exc}") from exc


def _service(request: Request) -> LeylineService:
    service = getattr(request.app.state, "leyline", None)
    if service is None:
        raise LeylineError("the Leyline plugin has no engine (render-only server)", code="unavailable",
                           status_code=503)
    return service


def _check_id(sid: str) -> str:
    if not sid or len(sid) > MAX_ID_LENGTH:
        raise ValidationFailed(f"session ids are 1..{MAX_ID_LENGTH} characters")
    return sid


class VllmSessions:
    """:class:`~leyline_runtime.api.sessions.SessionBackend` over the plugin's :class:`LeylineService`
    (one tenant: ``vllm serve`` has its own API-key check)."""

    def __init__(self, request: Request) -> None:
        self.service = _service(request)

    async def create_session(self, request: Request, body: SessionCreate, tenant: str) -> SessionInfo:
        return await self.service.create(body, rebuild_reason=request.headers.get(REBUILD_HEADER))

    async def list_sessions(self, request: Request, tenant: str) -> list[SessionInfo]:
        # This replica's sessions only: behind a router, each replica lists what was routed to it.
        return [self.service.info(s) for s in list(self.service.sessions.values())]

    async def get_session(self, request: Request, session_id: str, tenant: str,
                          include_messages: bool) -> SessionInfo:
        return self.service.info(self.service.get(session_id), include_messages)

    async def delete_session(self, request: Request, session_id: str, tenant: str) -> None:
        await self.service.delete(session_id)

    async def append(self, request: Request, session_id: str, body: AppendRequest, tenant: str) -> AppendResult:
        return await self.service.append(session_id, body.messages, body.expected_version)

    async def generate(self, request: Request, session_id: str, body: GenerateRequest,
                       tenant: str) -> GenerateResponse | Response:
        response = await self.service.generate(session_id, body)
        if body.stream:  # the runtime's event stream, in one piece: this plugin does not stream tokens
            return StreamingResponse(iter(_events_in_one_piece(response)), media_type="text/event-stream")
        return response

    async def apply(self, request: Request, batch: DirectiveBatch, tenant: str) -> DirectiveResult:
        return await self.service.apply(batch)


def _one_tenant() -> str:
    return "default"


def build_router(original_chat: APIRoute | None) -> APIRouter:
    """The shared session routes (leyline_runtime.api.sessions) and the plugin's own: health, bound chat."""
    router = APIRouter(tags=["leyline"], route_class=LeylineErrorRoute)
    router.include_router(build_session_router(VllmSessions, _one_tenant))

    if os.environ.get(DEBUG_ROUTES_ENV) == "1":
        @router.get("/leyline/debug/sessions/{session_id}/rows", include_in_schema=False)
        async def session_rows(request: Request, session_id: str):
            layer = int(request.query_params.get("layer", "0"))
            rank = int(request.query_params.get("rank", "0"))  # tensor parallel: each rank holds its heads
            rows = await _service(request).snapshot_rows(_check_id(session_id), layer, rank)
            if rows is None:
                raise LeylineError("the session has no saved rows", code="not_found", status_code=404)
            return {"shape": rows["shape"], "dtype": rows["dtype"], "data": base64.b64encode(rows["data"]).decode()}

    @router.get("/healthz", summary="Health")
    async def healthz(request: Request):
        support = getattr(request.app.state, "leyline_support", None) or {}
        return {"status": "ok", "model": _service(request).model_name, "splice": support}

    @router.post("/v1/chat/completions", summary="OpenAI chat completions; bound to a session, edits become directives")
    async def chat_completions(request: Request):
        raw = await _body(request)
        header = request.headers.get(SESSION_HEADER)
        bound = isinstance(raw, dict) and (raw.get("session_id") is not None or header)
        if not bound:
            return await _delegate(original_chat, request, raw)
        body = _parse(BoundChatRequest, raw)
        sid = body.session_id or _check_id(header)
        return await _bound_chat(_service(request), body, sid)

    return router


async def _delegate(original: APIRoute | None, request: Request, raw: Any):
    """A chat request without a session: vLLM's own handler, as if no plugin were loaded."""
    if original is None:
        raise LeylineError("vLLM's chat endpoint is not available", code="unavailable", status_code=503)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    try:
        parsed = ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise ValidationFailed(str(exc.errors(include_url=False, include_context=False))) from exc
    return await original.endpoint(request=parsed, raw_request=request)


async def _bound_chat(service: LeylineService, body: BoundChatRequest, sid: str) -> dict:
    if body.stream:
        raise ValidationFailed("streaming is not supported for session-bound requests on vLLM; send stream=false")
    tools = tools_message(body.tools or [], call=_named_tool(body.tool_choice),
                          required=body.tool_choice == "required")
    messages = ([tools] if tools else []) + list(body.messages)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if body.tool_choice == "none" and body.tools:
        stops.append(TOOL_CALL)
    sampling = GenerateRequest(
        max_tokens=body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0, seed=body.seed,
        stop=[s for s in stops if s] or None, logprobs=bool(body.logprobs),
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0)
    turn = await service.chat(sid, messages, body.leyline.mode if body.leyline else "amortize", sampling)
    response, prefilled = turn.response, turn.prefilled
    usage = response.usage
    message = response.message
    content = message.content if not (message.tool_calls and not message.content) else None
    choice = {"index": 0, "finish_reason": response.finish_reason,
              "message": {"role": "assistant", "content": content,
                          "tool_calls": [c.model_dump(mode="json") for c in message.tool_calls]
                          if message.tool_calls else None},
              "logprobs": {"content": [lp.model_dump(mode="json") for lp in response.logprobs]}
              if response.logprobs is not None else None}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": service.model_name, "choices": [choice],
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": max(0, usage.prompt_tokens - prefilled)}},
        "leyline": {"session_id": sid, "version": response.version, "built": turn.built, "rebuilt": turn.rebuilt,
                    "rebuild_reason": turn.rebuild_reason,
                    "directives_applied": len(turn.outcomes),
                    "outcomes": [o.model_dump(mode="json") for o in turn.outcomes],
                    "appended_messages": turn.appended, "prefilled_tokens": prefilled},
    }


def _named_tool(choice) -> str | None:
    if isinstance(choice, dict):
        return (choice.get("function") or {}).get("name")
    return None


class LeylineEndpoints:
    """The endpoint plugin: routes in ``attach_router``, the service in ``init_state``."""

    name = "leyline"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        original = next((r for r in app.routes if isinstance(r, APIRoute) and r.path == "/v1/chat/completions"
                         and "POST" in r.methods), None)
        app.include_router(build_router(original))

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None:
            return
        config = engine_client.vllm_config
        tokenizer = engine_client.renderer.get_tokenizer()
        names = getattr(args, "served_model_name", None)
        support = await splice_support(engine_client)
        state.leyline = LeylineService(
            engine_client, ChatRenderer(tokenizer), block_size=config.cache_config.block_size,
            max_model_len=config.model_config.max_model_len,
            model_name=names[0] if names else config.model_config.model,
            refusal=None if support.get("supported") else support.get("reason"),
            auto=AutoRule(auto_config_from_env(), num_layers=int(support.get("layers") or 0)))
        state.leyline_support = support
        register_collector(state.leyline)


async def splice_support(engine_client) -> dict:
    """The worker connector's verdict on this model (:meth:`LeylineConnector.support`); a worker
    that cannot answer (no connector, no worker extension) means nothing is spliced, and why."""
    try:
        answers = await engine_client.collective_rpc("leyline_support")
    except Exception as exc:  # noqa: BLE001 - any failure is a named refusal, never a failed start
        return {"supported": False, "reason": f"the worker did not answer leyline_support ({exc}); start vLLM "
                                              "with --kv-transfer-config and --worker-extension-cls (docs/vllm.md)"}
    refused = [a for a in answers if not a.get("supported")]
    return refused[0] if refused else answers[0]
