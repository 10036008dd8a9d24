"""ChatLeyline: a LangChain chat model that generates through a thread's runtime session.

Each call takes the messages LangChain hands it (the view), repairs tool-call
pairing, converts them, puts the bound tools in front as one system message,
and asks :class:`~leyline_sdk.memory.LeylineMemory` to generate: the memory
diffs the view against its shadow of the session, sends the edits as
directives and only the new messages with the generate request. The whole
history goes over the wire only when the session has to be built.

This is the one sync of a model call: inside ``langchain.agents.create_agent``
the model is the innermost step, so the messages it gets are the view after
every middleware (e.g. ``ContextEditingMiddleware``) edited it.

The thread: see :mod:`leyline_langchain.threads`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.utils import LC_ID_PREFIX
from langchain_core.language_models.chat_models import LangSmithParams
from pydantic import ConfigDict, Field, SecretStr, model_validator

from leyline_sdk.client import AsyncLeylineClient, LeylineClient
from leyline_sdk.memory import LeylineMemory
from leyline_sdk.protocol import GenerateResponse, Message

from .convert import (
    from_leyline,
    from_leyline_chunk,
    runtime_tool_choice,
    to_leyline_messages,
    tools_message,
    tools_to_openai,
)
from .pairing import repair_orphans
from .threads import pop_thread_kwarg, session_event, thread_id_of

__all__ = ["ChatLeyline"]


class ChatLeyline(BaseChatModel):
    """Chat model that generates through a :class:`LeylineMemory`'s thread sessions.

    ``ChatLeyline(base_url=..., api_key=...)`` builds its own memory (and so its own
    default thread); ``ChatLeyline.from_memory(memory)`` shares one.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    memory: LeylineMemory = Field(default=None, exclude=True)  # type: ignore[assignment]  # built if not given
    model: str = Field(default="leyline-default", alias="model_name")
    """The served model's name (``GET /v1/models``); reported as ``model_name``."""
    base_url: str | None = None
    """Runtime URL; default ``LEYLINE_BASE_URL`` or http://127.0.0.1:8000 (ignored with ``memory``)."""
    api_key: SecretStr | None = None
    """Default ``LEYLINE_API_KEY`` (ignored with ``memory``)."""
    timeout: float | None = None
    max_retries: int = 2
    streaming: bool = False
    """``invoke`` streams under the hood (callbacks see every token)."""
    thread_id: str | None = None
    """Fixed thread for this model; by default the run's ``thread_id``, else the memory's own default."""
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None

    @model_validator(mode="after")
    def _own_memory(self) -> ChatLeyline:
        if self.memory is None:
            key = self.api_key.get_secret_value() if self.api_key is not None else None
            sync = LeylineClient(self.base_url, key, timeout=self.timeout, max_retries=self.max_retries)
            async_ = AsyncLeylineClient(self.base_url, key, timeout=self.timeout, max_retries=self.max_retries)
            self.memory = LeylineMemory(sync, async_client=async_)
        return self

    @classmethod
    def from_memory(cls, memory: LeylineMemory, **kwargs: Any) -> ChatLeyline:
        """A chat model on ``memory`` (its threads, counters and policy)."""
        return cls(memory=memory, **kwargs)

    @property
    def _llm_type(self) -> str:
        return "leyline"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "leyline"
        params["ls_model_name"] = kwargs.get("model", self.model)
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens)
        params["ls_temperature"] = kwargs.get("temperature", self.temperature)
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def bind_tools(
        self,
        tools: Sequence[Mapping[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | Mapping[str, Any] | bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (as OpenAI function schemas). The runtime's grammar lets a call name only these
        tools, with arguments valid against their schemas; ``tool_choice`` "auto" (default), "none",
        "any"/"required"/True, or a tool name; ``parallel_tool_calls=False``: at most one call."""
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
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
        run_thread = pop_thread_kwarg(kwargs)
        thread = self.thread_id or run_thread or self.memory.default_thread_id
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        sampling: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                                    "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        for key in ("max_tokens", "temperature", "top_p", "top_k", "seed", "logprobs", "top_logprobs",
                    "parallel_tool_calls", "response_format"):
            if kwargs.get(key) is not None:
                sampling[key] = kwargs[key]
        unknown = set(kwargs) - set(sampling) - {"ls_structured_output_format"}
        if unknown:
            raise TypeError(f"ChatLeyline does not take {sorted(unknown)}")
        stops = list(stop or self.stop or [])
        if stops:
            sampling["stop"] = stops
        # Always constrained: with no tools bound, no tool call and no markup can be written.
        sampling["tools"] = list(tools or [])
        choice = runtime_tool_choice(tool_choice) if tools else None
        if choice is not None:
            sampling["tool_choice"] = choice
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
                "model_provider": "leyline", "model_name": self.model, "finish_reason": response.finish_reason,
                "session_id": response.session_id, "version": response.version,
                "session_event": session_event(call, response.session_id),
            },
            "usage_metadata": {
                "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "input_token_details": {"cache_read": max(0, usage.prompt_tokens - computed)},
            },
        }

    # -- LangChain hooks ----------------------------------------------------------------
    # The entry points carry the call's thread (from its RunnableConfig) down to the hooks,
    # which LangChain gives no config.

    @staticmethod
    def _with_thread(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        thread = thread_id_of(config)
        return kwargs if thread is None else {**kwargs, "leyline_thread_id": thread}

    def invoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        return super().invoke(input, config, stop=stop, **self._with_thread(config, kwargs))

    async def ainvoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
                      stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        return await super().ainvoke(input, config, stop=stop, **self._with_thread(config, kwargs))

    def stream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        return super().stream(input, config, stop=stop, **self._with_thread(config, kwargs))

    def astream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
                stop: list[str] | None = None, **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        return super().astream(input, config, stop=stop, **self._with_thread(config, kwargs))

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

    # Streaming: the session's generate streams its text as server-sent events; the tool
    # calls, usage and metadata come with the last chunk, when the reply is parsed.

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
                ) -> Iterator[ChatGenerationChunk]:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        message_id = self._message_id(run_manager)
        for event in self.memory.generate_stream(thread, view, message_id=message_id, **sampling):
            yield self._delta(event, message_id) if isinstance(event, str) else self._chunk(thread, event)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any
                       ) -> AsyncIterator[ChatGenerationChunk]:
        thread, view, sampling = self._prepare(messages, stop, kwargs)
        message_id = self._message_id(run_manager)
        async for event in self.memory.agenerate_stream(thread, view, message_id=message_id, **sampling):
            yield self._delta(event, message_id) if isinstance(event, str) else self._chunk(thread, event)

    @staticmethod
    def _delta(text: str, message_id: str) -> ChatGenerationChunk:
        return ChatGenerationChunk(message=AIMessageChunk(content=text, id=message_id))

    def _chunk(self, thread: str, response: GenerateResponse) -> ChatGenerationChunk:
        """The last chunk: the text was streamed already; calls, usage and metadata."""
        return ChatGenerationChunk(
            message=from_leyline_chunk(response.message, content="", **self._fields(thread, response)),
            generation_info={"finish_reason": response.finish_reason})
