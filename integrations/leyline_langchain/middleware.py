"""LeylineMiddleware: the ``create_agent`` side of LeylineMemory.

Put it **last** in ``middleware=[...]`` (the innermost wrapper), so the view it
sees is the one the model gets, after ``ContextEditingMiddleware`` and any
other middleware that edits the request. Around every model call it

1. resolves the thread (``configurable.thread_id`` of the run) and binds it for
   the chat model;
2. repairs tool-call pairing in the request (orphan results dropped, unanswered
   calls given a placeholder result) so the model never sees a broken unit;
3. diffs the view (system message + messages) against the session's shadow and
   sends the edits as one directive batch — before the model is called, so a
   lost or conflicting session is recovered here;
4. calls the model (``handler``): :class:`~leyline_langchain.chat_model.ChatLeyline`
   sends the new messages with its generate request (and the tools message,
   should the bound tools have changed), the only call that generates;
5. records the id the agent keeps for the reply in the shadow.

The agent's model must be a chat model on the same memory
(``ChatLeyline.from_memory(memory)``); ``leyline_langchain.create_agent`` wires both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage

from leyline_sdk.memory import LeylineMemory
from leyline_sdk.protocol import Message

from .chat_model import ChatLeyline
from .convert import to_leyline, to_leyline_messages
from .pairing import repair_orphans

__all__ = ["LeylineMiddleware"]


class LeylineMiddleware(AgentMiddleware):
    """Keeps a thread's runtime session in step with the view the agent's model gets."""

    def __init__(self, memory: LeylineMemory) -> None:
        super().__init__()
        self.memory = memory
        self.tools = []

    def _prepare(self, request: ModelRequest) -> tuple[ModelRequest, str, list[Message]]:
        model = request.model
        if not isinstance(model, ChatLeyline) or model.memory is not self.memory:
            raise TypeError(
                "LeylineMiddleware needs the agent's model to be a ChatLeyline on the same memory: use "
                "leyline_langchain.create_agent(memory, tools=..., middleware=[...]), or "
                "model=ChatLeyline.from_memory(memory) with middleware=[..., LeylineMiddleware(memory)]")
        thread = model.thread_id or self.memory.current_thread_id()
        messages = repair_orphans(request.messages, self.memory.placeholder)
        if messages is not request.messages:
            request = request.override(messages=messages)  # type: ignore[arg-type]  # same messages, repaired
        history: list[BaseMessage] = list(messages)
        if request.system_message is not None:
            history.insert(0, request.system_message)
        return request, thread, to_leyline_messages(history)

    def _after(self, thread: str, response: Any) -> None:
        reply = _reply(response)
        if reply is not None:
            self.memory.note_response_id(thread, reply.id, to_leyline(reply).fingerprint())

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> Any:
        request, thread, view = self._prepare(request)
        self.memory.sync(thread, view, append_tail=False, create=False, keep_tools_message=True)
        with self.memory.bind_thread(thread):
            response = handler(request)
        self._after(thread, response)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        request, thread, view = self._prepare(request)
        await self.memory.async_sync(thread, view, append_tail=False, create=False, keep_tools_message=True)
        with self.memory.bind_thread(thread):
            response = await handler(request)
        self._after(thread, response)
        return response


def _reply(response: Any) -> AIMessage | None:
    if isinstance(response, AIMessage):
        return response
    inner = getattr(response, "model_response", response)  # ExtendedModelResponse
    for message in getattr(inner, "result", None) or []:
        if isinstance(message, AIMessage):
            return message
    return None
