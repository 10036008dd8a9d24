"""ChatLeyline's promises beyond the standard suites, on the real runtime (in-process).

Constructor arguments reach the clients; every instance has its own default
thread; ``batch``/``abatch`` on one memory never interleave; ``streaming=True``
makes ``invoke`` stream; tool-call ids never repeat in a thread, also after the
runtime lost the session and it was rebuilt; every reply, streamed or not,
names the model and reports usage with ``cache_read``.
"""

from __future__ import annotations

import asyncio

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from integration_support import (  # app, client: fixtures
    app,
    async_client,
    client,
)

from leyline_langchain import ChatLeyline
from leyline_sdk import LeylineMemory

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look a key up",
    "parameters": {"type": "object", "properties": {"key": {"type": "string", "maxLength": 8}},
                   "required": ["key"]}}}


def test_constructor_arguments_reach_the_clients():
    model = ChatLeyline(base_url="http://127.0.0.1:9/v1", api_key="k-1", timeout=7.5, max_retries=5,
                        model_name="served-name")
    for client in (model.memory.client, model.memory.async_client):
        assert (client.base_url, client.api_key, client.max_retries) == ("http://127.0.0.1:9", "k-1", 5)
        assert client.timeout.read == 7.5
    assert model.model == "served-name" and model._get_ls_params()["ls_model_name"] == "served-name"


def test_every_instance_has_its_own_default_thread():
    a, b = ChatLeyline(base_url="http://127.0.0.1:9"), ChatLeyline(base_url="http://127.0.0.1:9")
    assert a.memory.default_thread_id != b.memory.default_thread_id
    assert a.memory.session_id(a.memory.default_thread_id) != b.memory.session_id(b.memory.default_thread_id)


def assert_reply(message: AIMessage) -> None:
    assert message.response_metadata["model_name"] == "leyline-default"
    usage = message.usage_metadata
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_token_details"]["cache_read"] >= 0


def test_batch_and_abatch_on_one_memory(client, app):
    memory = LeylineMemory(client)
    model = ChatLeyline.from_memory(memory, max_tokens=3)
    prompts = [f"question {i}" for i in range(6)]
    replies = model.batch(prompts, config={"max_concurrency": 6})
    assert len(replies) == 6
    for reply in replies:
        assert_reply(reply)
    thread = memory.default_thread_id
    # the calls ran one after the other: the session holds exactly the last call's view and reply
    session = client.get_session(memory.session_id(thread), include_messages=True).messages
    assert [m.fingerprint() for m in session] == [m.fingerprint() for m in memory.shadow(thread)]
    assert len(memory.calls(thread)) == 6

    async def scenario():
        async with async_client(app) as aclient:
            amemory = LeylineMemory(aclient)
            amodel = ChatLeyline.from_memory(amemory, max_tokens=3)
            areplies = await amodel.abatch(prompts)
            for reply in areplies:
                assert_reply(reply)
            athread = amemory.default_thread_id
            info = await aclient.get_session(amemory.session_id(athread), include_messages=True)
            assert [m.fingerprint() for m in info.messages] == [m.fingerprint() for m in amemory.shadow(athread)]

    asyncio.run(scenario())


class TokenCounter(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)


def test_streaming_true_makes_invoke_stream(client):
    memory = LeylineMemory(client)
    streaming = ChatLeyline.from_memory(memory, max_tokens=12, streaming=True, thread_id="s-on")
    counter = TokenCounter()
    reply = streaming.invoke("List three colours.", config={"callbacks": [counter]})
    assert_reply(reply)
    assert "".join(counter.tokens) == reply.content
    # token by token, not one piece (output_tokens counts the end marker: a one-token reply is one piece)
    assert len([t for t in counter.tokens if t]) >= min(2, reply.usage_metadata["output_tokens"] - 1)
    silent = ChatLeyline.from_memory(memory, max_tokens=12, streaming=False, thread_id="s-off")
    counter = TokenCounter()
    assert_reply(silent.invoke("List three colours.", config={"callbacks": [counter]}))
    assert counter.tokens == []


def test_streamed_replies_carry_model_and_usage(client):
    model = ChatLeyline.from_memory(LeylineMemory(client), max_tokens=6, thread_id="streamed-usage")
    full = None
    for chunk in model.stream("Say hello."):
        full = chunk if full is None else full + chunk
    assert_reply(full)


def test_tool_call_ids_stay_unique_across_rebuilds(client):
    memory = LeylineMemory(client)
    model = ChatLeyline.from_memory(memory, max_tokens=24, thread_id="ids", temperature=1.0, seed=1)
    bound = model.bind_tools([LOOKUP], tool_choice="any")
    history: list = [HumanMessage("Look up a, then b, then c.")]
    ids = []
    for turn in range(4):
        reply = bound.invoke(history)
        assert reply.tool_calls, reply
        ids += [c["id"] for c in reply.tool_calls]
        history += [reply, *[{"role": "tool", "content": "ok", "tool_call_id": c["id"]} for c in reply.tool_calls]]
        if turn % 2 == 0:
            client.delete_session(memory.session_id("ids"))  # lost: the next call rebuilds it
    assert memory.stats("ids").rebuilds == 2
    assert len(ids) == len(set(ids))
