"""The agent bench's stopping rules: every arm gets the same number of model calls; an overflow is named."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("langchain")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError

from leyline_bench.agent.run import call_limited_agent, edit_middleware, graph_step_limit


class AlwaysCallsATool(GenericFakeChatModel):
    """A model that never answers: every reply asks for the tool again (as the 0.5B did, to the limit)."""

    def bind_tools(self, tools, **kwargs):
        return self


@tool
def read_log(path: str) -> str:
    """Read a log file."""
    return "\n".join(f"line {i} of {path}" for i in range(40))  # long enough for the ten-line rule


@pytest.mark.parametrize("edits", [False, True], ids=["append", "edits"])
def test_every_arm_gets_max_calls_model_calls_then_stops(edits):
    replies = (AIMessage("", tool_calls=[{"name": "read_log", "args": {"path": f"/var/log/{i}"}, "id": f"c{i}"}])
               for i in itertools.count())
    model = AlwaysCallsATool(messages=replies)

    agent = call_limited_agent(model, [read_log], edit_middleware() if edits else [], "You are an agent.", 5)
    with pytest.raises(ModelCallLimitExceededError):
        agent.invoke({"messages": [("user", "What failed?")]}, {"recursion_limit": graph_step_limit(5)})
    assert next(replies).tool_calls[0]["id"] == "c5"  # five replies taken, the sixth call refused


def test_a_history_over_the_served_limit_counts_as_an_overflow():
    from leyline_sdk.errors import CapacityExceeded

    from leyline_bench.agent.run import is_overflow

    assert is_overflow(CapacityExceeded("the history has 4537 tokens; the model takes 4096"))
    assert not is_overflow(RuntimeError("connection reset"))
