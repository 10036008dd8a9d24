"""One call for a Leyline-backed LangGraph agent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent as langchain_create_agent
from langchain.agents.middleware import AgentMiddleware

from leyline_sdk.memory import LeylineMemory

from .chat_model import ChatLeyline
from .middleware import LeylineMiddleware

__all__ = ["create_agent"]


def create_agent(memory: LeylineMemory, tools: Sequence[Any] = (), *,
                 middleware: Sequence[AgentMiddleware] = (), model_kwargs: dict[str, Any] | None = None,
                 **agent_kwargs: Any) -> Any:
    """``langchain.agents.create_agent`` with the model and the middleware kept in step.

    The model is ``ChatLeyline.from_memory(memory, **model_kwargs)``; Leyline's
    middleware goes **last** (innermost), so the history it diffs is exactly what
    the model is shown after your middleware (e.g. ``ContextEditingMiddleware``)
    edited it. ``agent_kwargs`` go to ``create_agent`` (``checkpointer``,
    ``system_prompt``, ...).
    """
    if "model" in agent_kwargs:
        raise TypeError("create_agent builds the model from the memory; pass its settings as model_kwargs")
    model = ChatLeyline.from_memory(memory, **(model_kwargs or {}))
    stack = [*middleware, LeylineMiddleware(memory)]
    return langchain_create_agent(model=model, tools=list(tools), middleware=stack, **agent_kwargs)
