"""One arm of the agent benchmark: real LangGraph agents on a served runtime, over HTTP.

The agent is built the way a user wires it: ``langchain.agents.create_agent`` with
the Leyline chat model on a ``LeylineMemory`` over ``LeylineClient(base_url)``,
and LangChain's own edit middleware (``ContextEditingMiddleware(ClearToolUsesEdit)``
plus a ten-line truncation rule for old long tool outputs) for the arms that edit.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    ModelCallLimitMiddleware,
)
from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, ToolMessage

from leyline_langchain import ChatLeyline
from leyline_sdk import LeylineClient, LeylineMemory
from leyline_sdk.policy import ModePolicy, auto_policy, default_policy, force_mode
from .tasks import AgentTask

TRUNCATE_LINES = 10  # the ten-line rule: an old tool output keeps its first ten lines
CLEAR_TRIGGER_TOKENS = 2500  # ClearToolUsesEdit: clear old tool outputs past this many (approximate) tokens
CLEAR_KEEP = 2  # ... keeping the newest two
GRAPH_STEPS_PER_CALL = 8  # graph steps one model call may take (model, tools, the middlewares' hooks): ample


@dataclass(frozen=True)
class AgentArm:
    """One arm of the agent bench: whether LangChain's edit middlewares run, and the mode policy they reach."""

    name: str
    edits: bool
    policy: ModePolicy
    meaning: str


ARMS = {
    "append": AgentArm("append", False, default_policy, "append-only history on a prefix cache (never edits)"),
    "edits-forget": AgentArm("edits-forget", True, force_mode("forget"),
                             "LangChain edits on a plain prefix cache: each edit re-prefills from the edit point"),
    "edits-amortize": AgentArm("edits-amortize", True, force_mode("amortize"),
                               "the same edits through Leyline amortize"),
    "edits-auto": AgentArm("edits-auto", True, auto_policy, "the same edits through Leyline auto"),
}


class TruncateOldOutputs(AgentMiddleware):
    """The ten-line rule: once a newer tool output follows it, a long output keeps its first lines."""

    def before_model(self, state: dict[str, Any], runtime: Any) -> dict[str, Any] | None:
        outputs = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        edits = []
        for m in outputs[:-1]:
            lines = m.text.splitlines()
            if len(lines) > TRUNCATE_LINES + 1:
                kept = "\n".join(lines[:TRUNCATE_LINES])
                edits.append(m.model_copy(update={
                    "content": f"{kept}\n[... {len(lines) - TRUNCATE_LINES} more lines truncated]"}))
        return {"messages": edits} if edits else None


def edit_middleware() -> list[AgentMiddleware]:
    """The edits LangChain users configure (SummarizationMiddleware left out: see the report)."""
    return [ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=CLEAR_TRIGGER_TOKENS, keep=CLEAR_KEEP)]),
            TruncateOldOutputs()]


def leyline_agent_model(memory: LeylineMemory, edits: list[AgentMiddleware],
                        max_tokens: int) -> tuple[ChatLeyline, list[AgentMiddleware]]:
    """The agent's model and middleware stack: the one place the Leyline wiring lives.

    ChatLeyline is the innermost step, so it is shown (and syncs) the view after the edits."""
    model = ChatLeyline.from_memory(memory, max_tokens=max_tokens, temperature=0.0, streaming=True)
    return model, list(edits)


class ModelTimer(BaseCallbackHandler):
    """Per model call: seconds to the first streamed token and to the end."""

    def __init__(self) -> None:
        self.start: dict[uuid.UUID, float] = {}
        self.ttft: list[float] = []
        self.model_s = 0.0

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs) -> None:
        self.start[run_id] = time.perf_counter()

    def on_llm_new_token(self, token, *, run_id, **kwargs) -> None:
        if run_id in self.start and len(self.ttft) < len(self.start):
            self.ttft.append(time.perf_counter() - self.start[run_id])

    def on_llm_end(self, response, *, run_id, **kwargs) -> None:
        if run_id in self.start:
            if len(self.ttft) < len(self.start):  # no token streamed: the whole call is the first token
                self.ttft.append(time.perf_counter() - self.start[run_id])
            self.model_s += time.perf_counter() - self.start[run_id]


@dataclass
class TaskResult:
    task_id: str
    family: str
    kind: str
    solved: bool = False
    finished: bool = False
    overflow: bool = False
    error: str | None = None
    answer: str | None = None
    model_calls: int = 0
    tool_waits_s: list[float] = field(default_factory=list)
    model_s: float = 0.0
    run_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    computed_tokens: int = 0
    prefix_cache_tokens: int = 0
    directives: int = 0
    modes: dict[str, int] = field(default_factory=dict)


def is_overflow(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()  # the SDK's CapacityExceeded: "the model takes 4096"
    return any(w in text for w in ("context", "max_position", "too long", "exceeds", "positions", "capacity"))


def call_limited_agent(model, tools: list, middleware: list[AgentMiddleware], system_prompt: str, max_calls: int):
    """The agent, stopped (``ModelCallLimitExceededError``) when it asks for model call ``max_calls + 1``.

    The limit counts model calls, not graph steps: every middleware hook is a step of its own, so a
    recursion limit alone would give the arms that edit fewer model calls than append-only."""
    limit = ModelCallLimitMiddleware(run_limit=max_calls, exit_behavior="error")
    return create_agent(model=model, tools=tools, middleware=[limit, *middleware], system_prompt=system_prompt)


def graph_step_limit(max_calls: int) -> int:
    """LangGraph's recursion limit for a run of ``max_calls`` model calls: never the one that stops it."""
    return GRAPH_STEPS_PER_CALL * (max_calls + 1)


def run_task(base_url: str, arm: AgentArm, task: AgentTask, latency, max_tokens: int, max_calls: int,
             system_prompt: str) -> TaskResult:
    result = TaskResult(task.task_id, task.family, task.task.kind)
    memory = LeylineMemory(LeylineClient(base_url, timeout=600), policy=arm.policy)
    model, middleware = leyline_agent_model(memory, edit_middleware() if arm.edits else [], max_tokens)
    agent = call_limited_agent(model, task.tools(result.tool_waits_s, latency.sampler(task.task_id)),
                               middleware, system_prompt, max_calls)
    thread = f"{arm.name}-{task.task_id}"
    timer = ModelTimer()
    t0 = time.perf_counter()
    try:
        state = agent.invoke({"messages": [("user", task.question)]},
                             {"configurable": {"thread_id": thread}, "callbacks": [timer],
                              "recursion_limit": graph_step_limit(max_calls)})
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and not last.tool_calls:
            result.answer, result.finished = last.text, True
            result.solved = task.task.check(last.text)
    except ModelCallLimitExceededError:
        result.error = "call limit"
    except Exception as exc:  # noqa: BLE001 -- a failed request fails the task; it is counted, not raised
        result.overflow = is_overflow(exc)
        result.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    result.run_s = time.perf_counter() - t0
    result.model_s, result.ttft_s = timer.model_s, timer.ttft
    _add_token_stats(result, memory, thread)
    memory.reset(thread)
    return result


def _add_token_stats(result: TaskResult, memory: LeylineMemory, thread: str) -> None:
    stats = memory.stats(thread)
    result.model_calls = stats.model_calls
    result.prompt_tokens, result.computed_tokens = stats.prompt_tokens, stats.computed_tokens
    result.prefix_cache_tokens, result.directives = stats.prefix_cache_tokens, stats.directives
    for call in memory.calls(thread):
        for edit in call.edits:
            result.modes[str(edit.applied_mode)] = result.modes.get(str(edit.applied_mode), 0) + 1
