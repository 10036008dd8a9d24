"""Leyline's LangChain / LangGraph adapter.

    from langchain.agents import create_agent
    from langchain.agents.middleware import ContextEditingMiddleware
    from leyline_sdk import LeylineClient, LeylineMemory
    from leyline_langchain import ChatLeyline

    memory = LeylineMemory(LeylineClient())
    agent = create_agent(model=ChatLeyline.from_memory(memory, max_tokens=256), tools=[...],
                         middleware=[ContextEditingMiddleware(...)], checkpointer=InMemorySaver())

ChatLeyline owns the sync: each model call diffs the view it is given (after every
middleware edited it) against the session and sends the edits with the generate.
Threads: :mod:`leyline_langchain.threads`; the converters and the tool-pairing repair
stay importable from :mod:`.convert` and :mod:`.pairing`. Imports flow one way:
leyline_langchain -> leyline_sdk (never the runtime or torch).
"""

try:
    import langchain  # noqa: F401
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    # Leyline is on no package index: the extra installs from a checkout of the repository.
    raise ImportError(f"leyline_langchain needs LangChain ({exc.name} is missing): in the repository's "
                      "checkout, .venv/bin/pip install -e '.[langchain]' (the .venv make serve built; "
                      "another environment: its own pip, same arguments)", name=exc.name) from exc

from .chat_model import ChatLeyline
from .threads import ThreadSessionWarning

__all__ = ["ChatLeyline", "ThreadSessionWarning"]
