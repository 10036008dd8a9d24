"""Server-sent events for a generation that streams: chat completions and native generate.

The request waits for the generation in a worker thread; the engine calls
its ``on_token`` hook on the engine thread, which turns each sampled token
into safe text (tokenizer work stays off the event loop) and hands it to the
event loop through a queue. The response only starts once the first token
(or an error) is in: an error before any token (unknown session, version
conflict, cache too small) is an ordinary HTTP error, not a 200 stream. An error after that is sent as an event. When the
client goes away the next token aborts the generation.

What the events look like is the stream's :class:`StreamShape`: OpenAI's
chunks for ``/v1/chat/completions`` (:class:`ChatShape`), Leyline's own
``delta``/``done``/``error`` events for ``/sessions/{id}/generate``
(:class:`GenerateShape`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from leyline_sdk.errors import LeylineError
from leyline_sdk.protocol import GenerateResponse

from . import chat_chunks as out
from ..api.chat_response import CompletionIds
from ..api.chat_turn import ChatTurn
from ..api.openai_errors import error_body
from .chat import OnToken
from .streaming import DeltaDecoder

log = logging.getLogger("leyline.server")

R = TypeVar("R")
Item = tuple[str, Any]  # ("delta", text) | ("done", result) | ("error", exception)


class GenerationCancelled(Exception):
    """The streaming client disconnected."""


class StreamShape(Protocol[R]):
    """How one kind of stream writes its events (``terminator``: a last ``data:`` line, if any;
    ``named_events``: each event also carries an ``event:`` line, its body's ``type``)."""

    terminator: str | None
    named_events: bool

    def opening(self) -> list[dict[str, Any]]: ...
    def delta(self, text: str) -> dict[str, Any]: ...
    def closing(self, result: R, rest: str) -> list[dict[str, Any]]: ...
    def error(self, exc: Exception) -> dict[str, Any]: ...


def sse(body: dict[str, Any] | str, event: str | None = None) -> str:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


def _frame(shape: StreamShape[Any], body: dict[str, Any]) -> str:
    return sse(body, body["type"] if shape.named_events else None)


async def stream_tokens(run: Callable[[OnToken], R], decoder: DeltaDecoder, shape: StreamShape[R],
                        final_content: Callable[[R], str]) -> StreamingResponse:
    """Run ``run(on_token)`` in a worker thread and stream its text as ``shape``'s events."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Item] = asyncio.Queue()
    cancel = threading.Event()

    def on_token(token: int) -> None:  # engine thread: quick, never blocks
        if cancel.is_set():
            raise GenerationCancelled()
        loop.call_soon_threadsafe(queue.put_nowait, ("delta", decoder.push(token)))

    async def work() -> None:
        try:
            queue.put_nowait(("done", await run_in_threadpool(run, on_token)))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait(("error", exc))

    task = asyncio.create_task(work())
    try:
        first = await queue.get()
    except asyncio.CancelledError:
        cancel.set()
        raise
    if first[0] == "error":
        raise first[1]
    events = _events(first, queue, task, cancel, decoder, shape, final_content)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _events(first: Item, queue: asyncio.Queue[Item], task: asyncio.Task, cancel: threading.Event,
                  decoder: DeltaDecoder, shape: StreamShape[R], final_content: Callable[[R], str]
                  ) -> AsyncIterator[str]:
    # ``task`` is only held here: the loop keeps weak references to tasks.
    try:
        for body in shape.opening():
            yield _frame(shape, body)
        item = first
        while item[0] == "delta":
            if item[1]:
                yield _frame(shape, shape.delta(item[1]))
            item = await queue.get()
        if item[0] == "error":
            yield _frame(shape, shape.error(item[1]))
        else:
            for body in shape.closing(item[1], decoder.finish(final_content(item[1]))):
                yield _frame(shape, body)
        if shape.terminator is not None:
            yield sse(shape.terminator)
    finally:
        cancel.set()  # no-op once the generation is over; otherwise stops it


# --- the two shapes ------------------------------------------------------------------------


class ChatShape:
    """OpenAI's ``chat.completion.chunk`` events, then ``[DONE]``."""

    terminator = "[DONE]"
    named_events = False

    def __init__(self, ids: CompletionIds, include_usage: bool):
        self.ids, self.include_usage = ids, include_usage

    def opening(self) -> list[dict[str, Any]]:
        return [out.chunk(self.ids, {"role": "assistant", "content": ""})]

    def delta(self, text: str) -> dict[str, Any]:
        return out.chunk(self.ids, {"content": text})

    def closing(self, turn: ChatTurn, rest: str) -> list[dict[str, Any]]:
        chunks = [out.chunk(self.ids, {"content": rest})] if rest else []
        calls = out.tool_call_chunk(turn, self.ids)
        if calls:
            chunks.append(calls)
        chunks.append(out.final_chunk(turn, self.ids))
        if self.include_usage:
            chunks.append(out.usage_chunk(turn, self.ids))
        return chunks

    def error(self, exc: Exception) -> dict[str, Any]:
        return error_body(exc)[1]


class GenerateShape:
    """Leyline's events: ``{"type": "delta", "content"}`` while text comes, then one
    ``{"type": "done", "response": GenerateResponse}`` (tool calls, usage, version), or
    ``{"type": "error", "error": {"code", "message"}}``. The deltas concatenate to the
    final message's content."""

    terminator = None
    named_events = False

    def opening(self) -> list[dict[str, Any]]:
        return []

    def delta(self, text: str) -> dict[str, Any]:
        return {"type": "delta", "content": text}

    def closing(self, response: GenerateResponse, rest: str) -> list[dict[str, Any]]:
        done = {"type": "done", "response": response.model_dump(mode="json")}
        return [self.delta(rest), done] if rest else [done]

    def error(self, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, LeylineError):
            body = exc.to_body()
        else:
            log.error("unhandled error while streaming a generation", exc_info=exc)
            body = {"error": {"code": "internal_error", "message": "internal error"}}
        return {"type": "error", **body}


async def stream_chat(run: Callable[[OnToken], ChatTurn], decoder: DeltaDecoder, ids: CompletionIds,
                      include_usage: bool) -> StreamingResponse:
    return await stream_tokens(run, decoder, ChatShape(ids, include_usage),
                               lambda turn: turn.response.message.content)


async def stream_generate(run: Callable[[OnToken], GenerateResponse], decoder: DeltaDecoder) -> StreamingResponse:
    return await stream_tokens(run, decoder, GenerateShape(), lambda response: response.message.content)
