"""Request limits: what one request may ask of the server, checked before any work.

Two layers. :class:`BodyGuard` (ASGI middleware, outermost) reads the body
before the app sees it: over ``max_body_bytes`` is a 413 without reading
further, a body that does not arrive within ``body_timeout`` seconds is a 408
and the connection is closed (a slow or stalled client cannot hold a
worker). :func:`check_messages` then bounds a parsed request's messages: how
many, how large each, and a lower bound on their tokens computed from their
byte length, so a message far beyond the token limit is refused without
being tokenised. The exact token count is checked by the runtime
(``RuntimeConfig.max_request_tokens``) once it has encoded the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message as ASGIMessage, Receive, Scope, Send

from leyline_sdk.errors import RequestTooLarge
from leyline_sdk.protocol import Message

from leyline_runtime.config import Limits
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..api.errors import error_response
from ..api.messages_errors import anthropic_error_body
from ..api.openai_errors import OpenAIError, error_body

def message_bytes(message: Message) -> int:
    parts = [message.content, message.name or ""]
    for call in message.tool_calls or []:
        parts += [call.function.name, call.function.arguments]
    return sum(utf8_length(p) for p in parts)


def utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))  # isascii is O(1)


def check_messages(limits: Limits, tokenizer: ChatTokenizer, max_tokens: int, messages: list[Message],
                   where: str = "messages") -> None:
    """413 ``request_too_large`` when ``messages`` break a limit; cheap (no tokenisation)."""
    if len(messages) > limits.max_messages:
        raise RequestTooLarge(f"{where}: {len(messages)} messages; this server takes at most "
                              f"{limits.max_messages} per request (--max-messages)")
    at_least = 0
    for i, m in enumerate(messages):
        size = message_bytes(m)
        if size > limits.max_message_bytes:
            raise RequestTooLarge(f"{where}.{i}: {size} bytes of text; this server takes at most "
                                  f"{limits.max_message_bytes} per message (--max-message-bytes)")
        at_least += 2 + -(-size // tokenizer.longest_token_bytes)  # header + end marker + text
    if at_least > max_tokens:
        raise RequestTooLarge(f"{where}: at least {at_least} tokens; this server takes at most {max_tokens} "
                              f"new tokens per request (--max-request-tokens)")


def check_text(limits: Limits, tokenizer: ChatTokenizer, max_tokens: int, texts: Iterable[str],
               where: str) -> None:
    """The same bounds for token-unit replacement text."""
    for text in texts:
        size = utf8_length(text)
        if size > limits.max_message_bytes:
            raise RequestTooLarge(f"{where}: {size} bytes of text; this server takes at most "
                                  f"{limits.max_message_bytes} per message (--max-message-bytes)")
        if -(-size // tokenizer.longest_token_bytes) > max_tokens:
            raise RequestTooLarge(f"{where}: more than {max_tokens} tokens (--max-request-tokens)")


class BodyGuard:
    """Reads each request body within the size and time limits, then hands it to the app."""

    def __init__(self, app: ASGIApp, limits: Limits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body, refusal = None, self._check_declared_length(scope)
        if refusal is None:
            body, refusal = await self._read_body(receive)
        if refusal is not None:
            await refusal.response(scope)(scope, receive, send)
            return
        if body is None:
            return  # the client went away
        await self.app(scope, _replay(body, receive), send)

    def _check_declared_length(self, scope: Scope):
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return _Refusal(400, "invalid_body", "Content-Length is not a number")
                if length > self.limits.max_body_bytes:
                    return self._too_large(length)
        return None

    async def _read_body(self, receive: Receive):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except TimeoutError:
                return None, _Refusal(408, "request_timeout", f"the request body did not arrive within "
                                                            f"{self.limits.body_timeout:g} s (--body-timeout)")
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                return None, self._too_large(size, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _too_large(self, size: int, at_least: bool = False):
        return _Refusal(413, "request_too_large", f"the request body is {'over ' if at_least else ''}{size} bytes; "
                                                f"this server takes at most {self.limits.max_body_bytes} "
                                                f"(--max-body-bytes)")


@dataclass(frozen=True)
class _Refusal:
    status: int
    code: str
    message: str

    def response(self, scope: Scope) -> JSONResponse:
        """The error in the shape of the route family asked (Anthropic's on ``/v1/messages``, OpenAI's elsewhere on ``/v1``), closing the connection
        (the rest of the body is not read)."""
        headers = {"Connection": "close"}
        path = str(scope.get("path", ""))
        if path.startswith("/v1/messages"):
            status, body = anthropic_error_body(OpenAIError(self.message, code=self.code, status=self.status))
            return JSONResponse(body, status_code=status, headers=headers)
        if path.startswith("/v1/"):
            status, body = error_body(OpenAIError(self.message, code=self.code, status=self.status))
            return JSONResponse(body, status_code=status, headers=headers)
        return error_response(self.status, self.code, self.message, headers=headers)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> ASGIMessage:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: disconnect notices, for streaming responses

    return replay
