"""Which thread a model call belongs to, and what happened to its session.

The SDK's memory takes an explicit thread id; the LangChain/LangGraph lookups
live here. A call's thread is, in order: the model's own ``thread_id`` field,
``configurable.thread_id`` of the call's RunnableConfig (the ``config=`` given
to ``invoke``/``stream``, or the run's config inside a LangGraph graph), else
the memory's ``default_thread_id``. The session id is ``lg-<thread_id>``;
a thread id that cannot name a session is a ValueError, never silently mapped.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig, ensure_config

from leyline_sdk.memory import CallStats

__all__ = ["SessionEvent", "ThreadSessionWarning", "session_event", "thread_id_of"]

SessionEvent = Literal["created", "continued", "resynced"]


class ThreadSessionWarning(UserWarning):
    """This process took over a thread's session that it did not build or last write (another
    process, or an earlier run, holding the same ``thread_id``): its history was re-read from the
    runtime, and the two writers now share one session."""


def thread_id_of(config: RunnableConfig | None) -> str | None:
    """``configurable.thread_id`` of ``config``, else of the run's config (LangGraph sets it)."""
    thread = (ensure_config(config).get("configurable") or {}).get("thread_id")
    return None if thread is None else str(thread)


def session_event(call: CallStats | None, session_id: str) -> SessionEvent:
    """What the call did to its session; warns with :class:`ThreadSessionWarning` on a takeover."""
    if call is None or not (call.built or call.resyncs):
        return "continued"
    if call.built:
        return "created"
    warnings.warn(f"session {session_id!r} was re-read from the runtime: another process (or an earlier "
                  "run) with the same thread_id holds it; both now write to it", ThreadSessionWarning,
                  stacklevel=4)
    return "resynced"


def pop_thread_kwarg(kwargs: dict[str, Any]) -> str | None:
    """The thread ``invoke``/``stream`` put in the call's kwargs (see ChatLeyline)."""
    return kwargs.pop("leyline_thread_id", None)
