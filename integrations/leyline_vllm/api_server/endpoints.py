"""``vllm.endpoint_plugins`` entry: Leyline's REST surface for sessions on ``vllm serve``.

The session routes are the bundled runtime's own (``leyline_runtime.api.sessions``,
torch-free, served here by :class:`VllmSessions`), so
``leyline_sdk.LeylineClient`` / ``LeylineMemory`` work unchanged:
``/sessions`` (create, list, get, delete, ``/messages``, ``/generate``),
``POST /directives``, ``GET /healthz``, and ``POST /v1/chat/completions``
bound to a session (``session_id`` in the body or ``X-Leyline-Session``): the bundled
runtime's own bound chat too (``leyline_runtime.api.chat``: the request, its checks, the
turn's plan, the response and its ``leyline`` report), served here by :class:`VllmChat`,
which runs the planned edits and the reply as one pass through vLLM, with
``context_management``'s edits made first (``leyline_runtime.api.context_edits``: the newly
cleared spans become the turn's directives). A chat request without a session goes to vLLM's
own handler unchanged. Anthropic's ``/v1/messages`` is the same turn (:mod:`.messages`), on the session
its history continues when it names none.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.middleware import Middleware

from leyline_runtime.api.chat import bound_chat, bound_session, parse_chat_request, read_json
from leyline_runtime.api.chat_prompt import generate_request, prompt_messages
from leyline_runtime.api.chat_request import ChatCompletionRequest
from leyline_runtime.api.chat_turn import ChatTurn
from leyline_runtime.api.context_edits import apply_edits
from leyline_runtime.api.continuation import ContinuationIndex
from leyline_runtime.api.errors import LeylineErrorRoute, install_method_not_allowed
from leyline_runtime.api.openai_errors import OpenAIKnownErrorsRoute
from leyline_runtime.api.openapi import install_openapi, refuse_fields
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
    SessionCreate,
    SessionInfo,
)
from leyline_sdk.tools_prompt import TOOL_CALL

from .auth import AnthropicKeys, require_api_key, served_keys
from .auto_edits import AutoRule, auto_config_from_env
from .messages import ONE_TENANT, build_messages_router
from .metrics import register_collector
from .service import LeylineService
from .sampling import refused_sampling
from .template import ChatRenderer

log = logging.getLogger("leyline.vllm")

# Exposes a session's saved KV rows over HTTP: for the plugin's own tests and diagnostics only.
DEBUG_ROUTES_ENV = "LEYLINE_VLLM_DEBUG_ROUTES"


def _events_in_one_piece(response: GenerateResponse) -> list[str]:
    """A streamed generate's events (``delta``, then ``done``), sent once the reply is whole."""
    events = [{"type": "delta", "content": response.message.content}] if response.message.content else []
    events.append({"type": "done", "response": response.model_dump(mode="json")})
    return [f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events]


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


# What a session-bound chat asks that this plugin cannot do (leyline_runtime.api.chat.OPTIONAL_FEATURES): its
# reply is one pass through vLLM's generate, sampled by vLLM's plain parameters (.sampling), nothing constraining it.
REFUSED = {
    "stream": "the reply is sent whole (a chat without a session streams through vLLM's own route)",
    "response_format": "no constrained decoding here",
    "tool_choice": "tool calls are not constrained here: only 'auto' and 'none'",
    "parallel_tool_calls": "tool calls are not constrained here",
    "strict": "tool arguments are not constrained here",
    "frequency_penalty": "not passed on to vLLM here",
    "presence_penalty": "not passed on to vLLM here",
    "logit_bias": "not passed on to vLLM here",
}


class VllmChat:
    """:class:`~leyline_runtime.api.chat.ChatBackend` over the plugin's :class:`LeylineService`: the planned
    edits and the reply run as one pass through vLLM."""

    def __init__(self, request: Request) -> None:
        self.service = _service(request)
        self.served_model = self.service.model_name
        self.refused = {**REFUSED, **self.service.refused_sampling}  # and what this server's vLLM cannot take

    async def bound_turn(self, request: Request, session_id: str, body: ChatCompletionRequest,
                         tenant: str) -> ChatTurn:
        sampling = generate_request(body)
        if body.tool_choice == "none" and body.tools:
            # the tools stay in the prompt (toggling keeps the history cached); with no grammar here, a
            # call the model starts ends the reply instead
            sampling = sampling.model_copy(update={"stop": [*sampling.stop_strings(), TOOL_CALL]})
        # the edited history is what the session holds: each newly cleared result is one of the turn's directives
        messages, edits = apply_edits(body.context_management, prompt_messages(body), self.service.renderer)
        turn = await self.service.chat(session_id, messages, body.edit_mode, sampling)
        turn.applied_edits = edits
        return turn


def _one_tenant() -> str:
    return ONE_TENANT


# vLLM's own routes that a request without a session goes to (the plugin's replace them on their paths)
SHARED_PATHS = ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens")


def build_router(original: dict[str, APIRoute]) -> APIRouter:
    """The shared session routes (leyline_runtime.api.sessions) and the plugin's own: health, chat."""
    router = APIRouter(tags=["leyline"], route_class=LeylineErrorRoute)
    keyed = [Depends(require_api_key)]  # vLLM's own key check leaves paths outside /v1 open (.auth)
    router.include_router(build_session_router(VllmSessions, _one_tenant), dependencies=keyed)

    if os.environ.get(DEBUG_ROUTES_ENV) == "1":
        @router.get("/leyline/debug/sessions/{session_id}/rows", include_in_schema=False, dependencies=keyed)
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

    router.include_router(_chat_router(original.get("/v1/chat/completions")))
    router.include_router(build_messages_router(VllmChat, original))
    return router


def _chat_router(original_chat: APIRoute | None) -> APIRouter:
    """``/v1/chat/completions``: bound to a session, the shared bound chat; otherwise vLLM's own handler.
    Errors of the bound chat leave in OpenAI's shape, as on the bundled runtime's route."""
    router = APIRouter(tags=["leyline"], route_class=OpenAIKnownErrorsRoute)

    @router.post("/v1/chat/completions", summary="OpenAI chat completions; bound to a session, edits become directives")
    async def chat_completions(request: Request):
        data = read_json(await request.body())
        header = request.headers.get(SESSION_HEADER)
        if header is None and not (isinstance(data, dict) and data.get("session_id") is not None):
            return await _delegate(original_chat, request, data)
        body = parse_chat_request(data)
        session_id = bound_session(body.session_id, header)
        return await bound_chat(VllmChat(request), request, session_id, body, _one_tenant())

    return router


async def _delegate(original: APIRoute | None, request: Request, data: Any):
    """A chat request without a session: vLLM's own handler, as if no plugin were loaded."""
    if original is None:
        raise LeylineError("vLLM's chat endpoint is not available", code="unavailable", status_code=503)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest

    try:
        parsed = VllmChatRequest.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from exc
    return await original.endpoint(request=parsed, raw_request=request)


def _refused_sampling_in(app: FastAPI) -> Callable[[dict[str, Any]], None]:
    """Names in the document the sampling fields this server refuses (:func:`.sampling.refused_sampling`:
    known once the engine is up, before the document is first built)."""

    def document(schema: dict[str, Any]) -> None:
        service = getattr(app.state, "leyline", None)
        if service is not None:
            refuse_fields(schema, "GenerateRequest", service.refused_sampling)

    return document


class LeylineEndpoints:
    """The endpoint plugin: routes in ``attach_router``, the service in ``init_state``."""

    name = "leyline"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.app: FastAPI | None = None

    def attach_router(self, app: FastAPI) -> None:
        self.app = app
        original = {r.path: r for r in app.routes if isinstance(r, APIRoute) and r.path in SHARED_PATHS
                    and "POST" in r.methods}
        router = build_router(original)
        app.include_router(router)
        # vLLM's document, with the session models' rules in words its schema can carry (as the bundled
        # app's); a wrong method on a Leyline path answered as the bundled app answers it
        install_openapi(app, paths=sorted({route.path for route in router.routes}), then=_refused_sampling_in(app))
        install_method_not_allowed(app, router.routes)

    async def init_state(self, engine_client, state, args) -> None:
        state.leyline_api_keys = served_keys(args)
        self._accept_anthropic_keys(state.leyline_api_keys)
        if engine_client is None:
            return
        config = engine_client.vllm_config
        tokenizer = engine_client.renderer.get_tokenizer()
        names = getattr(args, "served_model_name", None)
        support = await splice_support(engine_client)
        state.leyline_continuations = ContinuationIndex()  # the Messages sessions found by their history (.messages)
        state.leyline = LeylineService(
            engine_client, ChatRenderer(tokenizer), block_size=config.cache_config.block_size,
            max_model_len=config.model_config.max_model_len,
            model_name=names[0] if names else config.model_config.model,
            refusal=None if support.get("supported") else support.get("reason"),
            auto=AutoRule(auto_config_from_env(), num_layers=int(support.get("layers") or 0)),
            refused_sampling=refused_sampling(config))
        state.leyline_support = support
        register_collector(state.leyline)


    def _accept_anthropic_keys(self, keys: list[bytes]) -> None:
        """``x-api-key`` on the Messages paths (:class:`.auth.AnthropicKeys`), outermost: vLLM adds its key check
        after the plugins' routes, and ``build_app`` already built the middleware stack (SageMaker's loader
        rebuilds it), so it is put first and the stack rebuilt as that loader does, before the server runs."""
        if not keys or self.app is None:
            return
        try:
            self.app.user_middleware.insert(0, Middleware(AnthropicKeys, keys=keys))
            if self.app.middleware_stack is not None:
                self.app.middleware_stack = self.app.build_middleware_stack()
        except Exception as exc:  # noqa: BLE001 - never stop the server: Bearer keys still work there
            log.warning("leyline: /v1/messages takes the key as Bearer only, not x-api-key (%s)", exc)


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
