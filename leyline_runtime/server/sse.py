"""Server-sent events for a streaming chat completion.

The chat turn runs in a worker thread; the engine's ``on_token`` hook turns
each sampled token into safe text there (tokenizer work stays off the event
loop) and hands it to the event loop through a queue. The response only
starts once the first token (or an error) is in: an error before any token
(unknown session, version conflict, cache too small) is an ordinary HTTP
error, not a 200 stream. An error after that is sent as an event. When the
client goes away the next token aborts the generation.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from . import completion as out
from .chat import ChatTurn, OnToken
from .completion import CompletionIds
from .openai_errors import error_body
from .streaming import DeltaDecoder

Item = tuple[str, Any]  # ("delta", text) | ("done", ChatTurn) | ("error", exception)


class GenerationCancelled(Exception):
    """The streaming client disconnected."""


def sse(body: dict[str, Any] | str) -> str:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return f"data: {data}\n\n"


async def stream_chat(run: Callable[[OnToken], ChatTurn], decoder: DeltaDecoder, ids: CompletionIds,
                      include_usage: bool) -> StreamingResponse:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Item] = asyncio.Queue()
    cancel = threading.Event()

    def on_token(token: int) -> None:  # worker thread
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
    events = _events(first, queue, task, cancel, decoder, ids, include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _events(first: Item, queue: asyncio.Queue[Item], task: asyncio.Task, cancel: threading.Event,
                  decoder: DeltaDecoder, ids: CompletionIds, include_usage: bool) -> AsyncIterator[str]:
    # ``task`` is only held here: the loop keeps weak references to tasks.
    try:
        yield sse(out.chunk(ids, {"role": "assistant", "content": ""}))
        item = first
        while item[0] == "delta":
            if item[1]:
                yield sse(out.chunk(ids, {"content": item[1]}))
            item = await queue.get()
        if item[0] == "error":
            yield sse(error_body(item[1])[1])
        else:
            for body in _closing_chunks(item[1], decoder, ids, include_usage):
                yield sse(body)
        yield sse("[DONE]")
    finally:
        cancel.set()  # no-op once the turn is over; otherwise stops the generation


def _closing_chunks(turn: ChatTurn, decoder: DeltaDecoder, ids: CompletionIds,
                    include_usage: bool) -> list[dict[str, Any]]:
    chunks = []
    rest = decoder.finish(turn.response.message.content)
    if rest:
        chunks.append(out.chunk(ids, {"content": rest}))
    calls = out.tool_call_chunk(turn, ids)
    if calls:
        chunks.append(calls)
    chunks.append(out.final_chunk(turn, ids))
    if include_usage:
        chunks.append(out.usage_chunk(turn, ids))
    return chunks
