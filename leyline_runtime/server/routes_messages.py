"""Anthropic's Messages API on the bundled runtime: ``/v1/messages`` and ``/v1/messages/count_tokens``.

A Messages request is translated into the chat request (:func:`~leyline_runtime.api.messages_request.
chat_request`) and run as the chat route runs it (:meth:`ChatService.complete`: the same turn, the same
session binding by ``X-Leyline-Session``, the same constrained decoding and ``context_management``).
A request without ``X-Leyline-Session`` is bound to the held session its history continues, or to a
new one (:mod:`leyline_runtime.api.continuation`: the rule). Only the answer's shape is Anthropic's
(:mod:`leyline_runtime.api.messages_response`), and so are the errors
(:mod:`leyline_runtime.api.messages_errors`). The key comes as ``x-api-key`` (Anthropic's
clients) or ``Authorization: Bearer``; ``anthropic-version`` and ``anthropic-beta`` are accepted and
change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from leyline_sdk.protocol import MAX_ID_LENGTH, SESSION_ID_PATTERN, SESSION_ID_RULE, Message

from ..api.chat import bound_session, check_request
from ..api.chat_prompt import prompt_messages, stop_strings
from ..api.chat_request import ChatCompletionRequest
from ..api.continuation import ContinuationIndex, Scope
from ..api.errors import SESSION_HEADER
from ..api.json_body import OrjsonRoute
from ..api.messages_errors import AnthropicRoute, anthropic_error_responses
from ..api.messages_request import MessagesPrompt, MessagesRequest, chat_request
from ..api.messages_response import (
    MessageReply,
    MessagesStreamShape,
    MessagesTurn,
    TokenCount,
    message_id,
    message_reply,
    reply_sent_back,
    token_count,
)
from ..api.sse_schema import sse_content
from ..runtime import Runtime
from ..text.tokenizer import ChatTokenizer
from .auth import Authenticator
from .chat import ChatService, OnToken
from .routes_sessions import check_limits
from .sse import stream_tokens
from .streaming import DeltaDecoder


class _Route(AnthropicRoute, OrjsonRoute):
    """Bodies parsed with orjson; every error answered in Anthropic's shape."""


router = APIRouter(prefix="/v1", tags=["anthropic"], route_class=_Route)

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server was started with keys")
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="An API key (Anthropic's header)")
_BINDING = (f"With `{SESSION_HEADER}`, the turn runs on that session. Without it, on the held session whose "
            "history (as the client sends it, and the reply it got) the request's messages start with, among this "
            "API key's sessions, and `metadata.user_id`'s and `x-claude-code-session-id`'s when given; none: a "
            "new session. Either way the reply's `leyline.session_id` names it.")
Turn = Callable[[str | None, OnToken | None], MessagesTurn]  # a Messages turn on the session named
_STREAM_DOC = sse_content('event: message_start\ndata: {"type": "message_start", ...}\n\n')


def messages_tenant(request: Request,
                    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                    api_key: Annotated[str | None, Depends(_api_key)]) -> str:
    """The caller's tenant, from ``x-api-key`` or a Bearer token; 401 without a known key."""
    auth: Authenticator = request.app.state.auth
    return auth.tenant(api_key or (bearer.credentials if bearer else None))


Tenant = Annotated[str, Depends(messages_tenant)]
AnthropicVersion = Annotated[str | None, Header(alias="anthropic-version", max_length=64,
                                                description="Accepted; any version")]
AnthropicBeta = Annotated[str | None, Header(alias="anthropic-beta", max_length=1024,
                                             description="Accepted; `context_management` needs no beta here")]
ClientSession = Annotated[str | None, Header(alias="x-claude-code-session-id", max_length=256,
                                             description="Claude Code's own session: without "
                                             f"`{SESSION_HEADER}`, only this client session's held sessions "
                                             "are continued")]
SessionHeader = Annotated[str | None, Header(alias=SESSION_HEADER, pattern=SESSION_ID_PATTERN,
                                             max_length=MAX_ID_LENGTH,
                                             description=f"Bind the request to a session: {SESSION_ID_RULE}")]


class StopWatch:
    """The tokens a generation sampled, and which stop sequence ended it (the reply leaves it out)."""

    def __init__(self, tokenizer: ChatTokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.tokens: list[int] = []

    def watch(self, then: OnToken | None) -> OnToken:
        def on_token(token: int) -> None:  # engine thread: quick
            self.tokens.append(token)
            if then is not None:
                then(token)
        return on_token

    def matched(self) -> str | None:
        if not self.stops:
            return None
        special = self.tokenizer.special_ids
        text = self.tokenizer.decode([t for t in self.tokens if t not in special])
        found = [(text.find(s), i) for i, s in enumerate(self.stops) if s in text]
        return self.stops[min(found)[1]] if found else None


def _run(service: ChatService, body: ChatCompletionRequest, tenant: str) -> Turn:
    def run(session_id: str | None, on_token: OnToken | None = None) -> MessagesTurn:  # in a worker thread
        stops = StopWatch(service.runtime.tokenizer, stop_strings(body))
        turn = service.complete(body, tenant, session_id, on_token=stops.watch(on_token))
        return MessagesTurn(turn, stops.matched() if turn.response.finish_reason == "stop" else None)
    return run


def _bound(run: Turn, session_id: str) -> Callable[[OnToken | None], MessagesTurn]:
    def run_bound(on_token: OnToken | None = None) -> MessagesTurn:  # in a worker thread
        return run(session_id, on_token)
    return run_bound


def _continued(run: Turn, index: ContinuationIndex, scope: Scope,
               history: list[Message]) -> Callable[[OnToken | None], MessagesTurn]:
    """``run`` on the held session ``history`` continues in ``scope``, or on a new one (a miss)."""
    def run_continued(on_token: OnToken | None = None) -> MessagesTurn:  # in a worker thread
        with index.continuing(scope, history) as bound:
            answered = run(bound.session_id, on_token)
            bound.reply = reply_sent_back(answered.turn)
        return answered
    return run_continued


@router.post("/messages", response_model=MessageReply,
             responses={200: {"content": _STREAM_DOC, "description": "A message, or Anthropic's SSE events when "
                              "`stream` is true"}, **anthropic_error_responses()},
             summary="Anthropic Messages; history edits become directives on the session",
             description=_BINDING)
async def create_message(body: MessagesRequest, request: Request, tenant: Tenant,
                         anthropic_version: AnthropicVersion = None, anthropic_beta: AnthropicBeta = None,
                         x_leyline_session: SessionHeader = None,
                         client_session: ClientSession = None) -> MessageReply | StreamingResponse:
    service: ChatService = request.app.state.chat
    model = service.runtime.config.model_name
    chat = chat_request(body)
    check_limits(request, chat.messages)
    check_request(chat, model, {})
    session_id = bound_session(None, x_leyline_session)
    turn = _run(service, chat, tenant)
    if session_id is not None:
        run = _bound(turn, session_id)
    else:  # no session named: the held one this history continues, or a new one
        user = body.metadata.user_id if body.metadata else None
        run = _continued(turn, request.app.state.continuations, Scope(tenant, user, client_session),
                         prompt_messages(chat))
    msg_id = message_id()
    if not body.stream:
        return message_reply(await run_in_threadpool(run, None), msg_id, model)
    decoder = DeltaDecoder(service.runtime.tokenizer, stop_strings(chat))
    return await stream_tokens(run, decoder, MessagesStreamShape(msg_id, model),
                               lambda answered: answered.turn.response.message.content)


@router.post("/messages/count_tokens", response_model=TokenCount, responses=anthropic_error_responses(),
             summary="The prompt's tokens for a Messages request, as the model would see them")
async def count_tokens(body: MessagesPrompt, request: Request, tenant: Tenant,
                       anthropic_version: AnthropicVersion = None,
                       anthropic_beta: AnthropicBeta = None) -> TokenCount:
    runtime: Runtime = request.app.state.runtime
    chat = chat_request(body)
    check_limits(request, chat.messages)
    check_request(chat, runtime.config.model_name, {})

    def tokens(messages: list[Message]) -> int:  # + the assistant header the reply starts with
        return sum(map(len, runtime.tokenizer.encode_messages(messages))) + 1

    return token_count(chat, runtime.tokenizer, tokens, body.context_management is not None)
