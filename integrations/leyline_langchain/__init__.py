"""Framework adapters for Leyline: LangChain / LangGraph.

    from leyline_sdk import LeylineClient, LeylineMemory

    memory = LeylineMemory(LeylineClient())
    agent = create_agent(
        model=memory.chat_model(max_tokens=256),
        tools=[...],
        middleware=[ContextEditingMiddleware(...), memory.middleware()],  # Leyline last
        checkpointer=InMemorySaver(),
    )

Imports flow one way: integrations -> leyline_sdk (never the runtime or torch).
"""

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
