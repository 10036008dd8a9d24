"""LangChain's own standard suites (``langchain-tests``) on ``langchain-anthropic``'s ``ChatAnthropic``, its
``base_url`` at a real ``leyline-runtime serve`` (Anthropic's Messages API, ``/v1/messages``).

As for ChatLeyline (``test_langchain_standard.py``): a real server subprocess with the shipped default
model, nothing mocked, and the feature flags say what the server supports: tool calling (``tool_choice``
under the runtime's grammar), structured output through a forced tool call, Anthropic's own content
blocks (``tool_use``, ``tool_result``, ``thinking``, ``cache_control``), usage with ``cache_read`` and
``cache_creation`` (a call without a session id continues the held session whose history it carries);
no images, PDFs, audio or JSON mode.
"""

from __future__ import annotations

import operator
from functools import reduce

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_anthropic._client_utils import _get_default_async_httpx_client
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from served_runtime import API_KEY, server  # noqa: F401 - the real server fixture

MODEL = "leyline-default"
PARAMS = {"model": MODEL, "temperature": 0.0, "max_retries": 0}
NOWHERE = "http://127.0.0.1:9"  # the unit suite never sends a request


class TestChatAnthropicUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatAnthropic]:
        return ChatAnthropic

    @property
    def chat_model_params(self) -> dict:
        return {**PARAMS, "base_url": NOWHERE, "api_key": "unused"}

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return ({"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": NOWHERE}, PARAMS,
                {"anthropic_api_url": NOWHERE})


@pytest.mark.slow  # ~100 short generations on a real server subprocess, as ChatLeyline's suite
class TestChatAnthropicIntegration(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _server_url(self, server):  # noqa: F811
        type(self).base_url = server[0]

    @pytest.fixture(autouse=True)
    def _async_pool_of_this_loop(self):
        # ChatAnthropic keeps one async connection pool per base URL for the whole process (an lru_cache),
        # as for an application with one event loop; pytest-asyncio gives each test a loop of its own, and
        # a pool left from an earlier test's closed loop fails with "Event loop is closed" in the client.
        _get_default_async_httpx_client.cache_clear()

    @property
    def chat_model_class(self) -> type[ChatAnthropic]:
        return ChatAnthropic

    @property
    def chat_model_params(self) -> dict:
        return {**PARAMS, "max_tokens": 128, "base_url": type(self).base_url, "api_key": API_KEY}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def supported_usage_metadata_details(self) -> dict:
        both = ["cache_read_input", "cache_creation_input"]
        return {"invoke": both, "stream": both}

    def _two_turns(self, *, stream: bool) -> AIMessage:
        """A conversation's second call: it names no session, and reads the first call's history from
        the session the server found by it."""
        model = ChatAnthropic(**self.chat_model_params)
        history = [HumanMessage("Read this notice twice. " + "The quick brown fox jumps over the dog. " * 20)]
        history += [model.invoke(history), HumanMessage("And now?")]
        if not stream:
            return model.invoke(history)
        return reduce(operator.add, model.stream(history))  # type: ignore[return-value]

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        message = self._two_turns(stream=stream)
        # the suite only asks for a count; the server read the first call's rows
        assert message.usage_metadata["input_token_details"]["cache_read"] > 0
        return message

    def invoke_with_cache_creation_input(self, *, stream: bool = False) -> AIMessage:
        model = ChatAnthropic(**self.chat_model_params)
        prompt = [HumanMessage("A conversation of its own: " + "every call's history is kept. " * 8)]
        message = reduce(operator.add, model.stream(prompt)) if stream else model.invoke(prompt)
        # a first call: its whole prompt computed and kept in the session a next call continues
        assert message.usage_metadata["input_token_details"]["cache_creation"] > 0
        return message  # type: ignore[return-value]
