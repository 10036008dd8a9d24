"""ChatLeyline: a LangChain chat model that generates through a thread's runtime session.

Each call takes the messages LangChain hands it (the view), repairs tool-call
pairing, converts them, puts the bound tools in front as one system message,
and asks :class:`~leyline_sdk.memory.LeylineMemory` to generate: the memory
diffs the view against its shadow of the session, sends the edits as
directives and only the new messages with the generate request. The whole
history goes over the wire only when the session has to be built.

The thread is the model's own ``thread_id`` field when set, else
:meth:`LeylineMemory.current_thread_id`: the thread bound by the middleware,
else ``configurable.thread_id`` of the LangGraph run, else the memory's
default thread.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.utils import LC_ID_PREFIX
from pydantic import ConfigDict, Field

from leyline_sdk.memory import LeylineMemory
from leyline_sdk.protocol import GenerateResponse, Message

from .convert import TOOL_CALL, from_leyline, from_leyline_chunk, to_leyline_messages, tools_message, tools_to_openai
from .pairing import repair_orphans

__all__ = ["ChatLeyline"]


class ChatLeyline(BaseChatModel):
    """Chat model bound to a :class:`LeylineMemory` (make it with ``memory.chat_model()``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: LeylineMemory = Field(exclude=True)
    thread_id: str | None = None
    """Fixed thread for this model; by default the run's ``thread_id``."""
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None

    @property
    def _llm_type(self) -> str:
        return "leyline"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed}

    def bind_tools(
        self,
        tools: Sequence[Mapping[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | Mapping[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (as OpenAI function schemas); the model may answer with tool calls."""
        return self.bind(tools=tools_to_openai(tools), tool_choice=tool_choice, **kwargs)

    # -- the view -----------------------------------------------------------------------

    def view(self, messages: Sequence[BaseMessage], tools: Sequence[Mapping[str, Any]] | None = None,
             tool_choice: Any = None) -> list[Message]:
        """The runtime messages for a call: tools message, then the repaired, converted history."""
        repaired = repair_orphans(list(messages), self.memory.placeholder)
        head = tools_message(tools, tool_choice)
        return ([head] if head else []) + to_leyline_messages(repaired)

    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
                 ) -> tuple[str, list[Message], dict[str, Any]]:
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        sampling: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                                    "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        for key in ("max_tokens", "temperature", "top_p", "top_k", "seed", "logprobs", "top_logprobs"):
            if kwargs.get(key) is not None:
                sampling[key] = kwargs[key]
        stops = list(stop or self.stop or [])
        if tools and tool_choice == "none":
            stops.append(TOOL_CALL)  # tools stay in the prompt, the model just cannot open a call
        if stops:
            sampling["stop"] = stops
        thread = self.thread_id or self.memory.current_thread_id()
        return thread, self.view(messages, tools, tool_choice), sampling

    @staticmethod
    def _message_id(run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None) -> str:
        """The reply's id, given here so that the shadow and the graph state agree on it.

        With a run manager it is the id LangChain itself would give (its v2 stream
        path imposes that one); without (LangChain's v1 stream path calls
        ``_stream`` without it) a fresh one, which LangChain keeps.
        """
        if run_manager is not None:
            return f"{LC_ID_PREFIX}-{run_manager.run_id}"
        return f"{LC_ID_PREFIX}-{uuid.uuid4()}"

    def _result(self, thread: str, response: GenerateResponse) -> ChatResult:
        message = from_leyline(response.message, **self._fields(thread, response))
        return ChatResult(generations=[ChatGeneration(
            message=message, generation_info={"finish_reason": response.finish_reason})])

    def _fields(self, thread: str, response: GenerateResponse) -> dict[str, Any]:
        usage = response.usage
        call = self.memory.last_call(thread)
        computed = call.computed_tokens if call is not None else usage.prefill_tokens
        return {
            "response_metadata": {
                "model_provider": "leyline", "finish_reason": response.finish_reason,
                "session_id": response.session_id, "version": response.version,
            },
            "usage_metadata": {
                "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "input_token_details": {"cache_read": max(0, usage.prompt_tokens - computed)},
            },
        }

    # -- LangChain hooks ----------------------------------------------------------------

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        response = self.memory.generate(thread, view, message_id=self._message_id(run_manager), **sampling)
        return self._result(thread, response)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        response = await self.memory.agenerate(thread, view, message_id=self._message_id(run_manager),
                                               **sampling)
        return self._result(thread, response)

    # The session-native generate path does not stream: one chunk with the whole message.

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
                ) -> Iterator[ChatGenerationChunk]:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        response = self.memory.generate(thread, view, message_id=self._message_id(run_manager), **sampling)
        yield self._chunk(thread, response)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
                       ) -> AsyncIterator[ChatGenerationChunk]:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        response = await self.memory.agenerate(thread, view, message_id=self._message_id(run_manager),
                                               **sampling)
        yield self._chunk(thread, response)

    def _chunk(self, thread: str, response: GenerateResponse) -> ChatGenerationChunk:
        return ChatGenerationChunk(
            message=from_leyline_chunk(response.message, **self._fields(thread, response)),
            generation_info={"finish_reason": response.finish_reason})
