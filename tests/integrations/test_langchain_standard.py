"""LangChain's own standard suites (``langchain-tests``) on ChatLeyline, against a real runtime.

The integration suite talks to a real ``leyline-runtime serve`` subprocess with the
shipped default model, nothing mocked. The feature flags say honestly what
ChatLeyline supports: tool calling (enforced by the runtime's grammar), structured
output through tools or a JSON schema, usage with ``cache_read``; no images, audio,
PDFs or logprobs through LangChain.
"""

from __future__ import annotations

import operator
from functools import reduce

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.integration_tests.chat_models import magic_function, unicode_customer
from langchain_tests.unit_tests import ChatModelUnitTests
from served_runtime import API_KEY, server  # noqa: F401 - the real server fixture

from leyline_langchain import ChatLeyline

# A small, greedy reply budget: the default model is tiny and the suites make ~100 calls.
PARAMS = {"model": "leyline-default", "temperature": 0.0}


class TestChatLeylineUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatLeyline]:
        return ChatLeyline

    @property
    def chat_model_params(self) -> dict:
        return {**PARAMS, "base_url": "http://127.0.0.1:9", "api_key": "unused"}

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return ({"LEYLINE_BASE_URL": "http://127.0.0.1:9", "LEYLINE_API_KEY": "k"}, PARAMS, {})

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True


class ModelQuality(Exception):
    """The suite's check failed on a value only the model can get right; the guarantees held."""


# xfail only for ModelQuality: any other failure (an AssertionError of the guarantee checks
# below, an error) fails the test. The suite wants overridden tests marked xfail with a reason.
MODEL_QUALITY = pytest.mark.xfail(
    raises=ModelQuality, strict=False,
    reason="model quality, not the adapter: the 12.8M default model must copy a value from the prompt "
           "(input 3; a Chinese name); the forced call itself is checked valid first")


@pytest.mark.slow  # ~100 short generations on a real server subprocess
class TestChatLeylineIntegration(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _server_url(self, server):  # noqa: F811
        type(self).base_url = server[0]

    @property
    def chat_model_class(self) -> type[ChatLeyline]:
        return ChatLeyline

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
    def structured_output_kwargs(self) -> dict:
        return {}

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """The second call of a thread reads the first call's history from the session's cache."""
        model = ChatLeyline(**self.chat_model_params)
        history = [HumanMessage("Read this notice twice. " + "The quick brown fox jumps over the dog. " * 20)]
        first = model.invoke(history)
        history += [first, HumanMessage("And now?")]
        if not stream:
            return model.invoke(history)
        chunks = list(model.stream(history))
        return reduce(operator.add, chunks)  # type: ignore[return-value]

    # The two tests below check values the model must pick (``magic_function(3)`` -> input 3; a
    # Chinese name copied into an argument). The runtime guarantees the rest: a forced call names
    # the offered tool with arguments valid against its schema. When the suite's check fails, the
    # guarantee is checked here (invoke and stream); only if it holds is the failure put down to
    # the model (ModelQuality, the only xfail). Everything else in both suites runs unmarked.

    @MODEL_QUALITY
    def test_tool_calling(self, model) -> None:
        try:
            super().test_tool_calling(model)
        except AssertionError as exc:
            self._forced_call_is_valid(model, magic_function, "What is the value of magic_function(3)? Use the tool.",
                                       lambda args: isinstance(args["input"], int) and -1000 < args["input"] < 1000)
            raise ModelQuality(f"a valid magic_function call, but not with input 3: {exc}") from exc

    @MODEL_QUALITY
    async def test_tool_calling_async(self, model) -> None:
        try:
            await super().test_tool_calling_async(model)
        except AssertionError as exc:
            self._forced_call_is_valid(model, magic_function, "What is the value of magic_function(3)? Use the tool.",
                                       lambda args: isinstance(args["input"], int) and -1000 < args["input"] < 1000)
            raise ModelQuality(f"a valid magic_function call, but not with input 3: {exc}") from exc

    @MODEL_QUALITY
    def test_unicode_tool_call_integration(self, model, *, tool_choice=None, force_tool_call=True) -> None:
        try:
            super().test_unicode_tool_call_integration(model, tool_choice=tool_choice,
                                                       force_tool_call=force_tool_call)
        except AssertionError as exc:
            self._forced_call_is_valid(
                model, unicode_customer, "Create a customer named '你好啊集团' (Hello Group)",
                lambda args: isinstance(args["customer_name"], str) and isinstance(args["description"], str))
            raise ModelQuality(f"a valid unicode_customer call, but not the name asked for: {exc}") from exc

    @staticmethod
    def _forced_call_is_valid(model: ChatLeyline, tool, prompt: str, args_ok) -> None:
        bound = model.bind_tools([tool], tool_choice="any")
        streamed = reduce(operator.add, bound.stream(prompt))
        for message in (bound.invoke(prompt), streamed):
            assert isinstance(message, AIMessage) and not message.invalid_tool_calls
            assert [c["name"] for c in message.tool_calls] == [tool.name]
            assert message.tool_calls[0]["id"] and args_ok(message.tool_calls[0]["args"])

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}
