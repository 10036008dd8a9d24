"""Leyline's LangChain / LangGraph adapter.

    from leyline_sdk import LeylineClient, LeylineMemory
    from leyline_langchain import create_agent

    memory = LeylineMemory(LeylineClient())
    agent = create_agent(memory, tools=[...], middleware=[ContextEditingMiddleware(...)],
                         model_kwargs={"max_tokens": 256}, checkpointer=InMemorySaver())

The adapter builds itself from a memory (``ChatLeyline.from_memory(memory)``,
``LeylineMiddleware(memory)``); imports flow one way: leyline_langchain ->
leyline_sdk (never the runtime or torch).
"""

try:
    import langchain  # noqa: F401
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"leyline_langchain needs LangChain ({exc.name} is missing): "
                      "pip install 'leyline-kv[langchain]'") from exc

from .agent import create_agent
from .chat_model import ChatLeyline
from .convert import (
    TOOLS_MESSAGE_ID,
    from_leyline,
    render_tools,
    to_leyline,
    to_leyline_messages,
    tools_message,
    tools_to_openai,
)
from .middleware import LeylineMiddleware
from .pairing import DEFAULT_PLACEHOLDER, OrphanReport, find_orphans, repair_orphans

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "TOOLS_MESSAGE_ID",
    "ChatLeyline",
    "LeylineMiddleware",
    "create_agent",
    "OrphanReport",
    "find_orphans",
    "from_leyline",
    "render_tools",
    "repair_orphans",
    "to_leyline",
    "to_leyline_messages",
    "tools_message",
    "tools_to_openai",
]
