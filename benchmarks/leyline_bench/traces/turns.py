"""A real session as the model calls it made, and as each policy would have sent them.

The shipped mini-swe-agent sessions are ``system, user, (assistant, tool | user)*``: every
assistant message is the model's answer to the history before it. Model call ``k`` therefore
sent ``messages[:i_k]``, where ``i_k`` is the index of the session's ``k``-th assistant message
(the *raw* history: mini-swe-agent edits nothing). A replay sends, at each call, the history the
policy makes of that raw history (:mod:`.policies`), then continues with the session's real
assistant message and the next observation: the raw history of the next call.

The replay is capped to a context budget: calls are kept from the first while the raw history
holds at most ``cap`` tokens (``count``: the prompt's tokens as the reference model renders them,
with the generation prompt), so every policy replays the same calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from leyline_sdk.protocol import Message

Count = Callable[[list[Message]], int]


@dataclass
class ReplayedSession:
    """One session's replay under one policy: the raw and the sent history of every call kept."""

    instance_id: str
    policy: str
    raw: list[list[Message]]
    sent: list[list[Message]]
    edited_turns: list[int] = field(default_factory=list)  # calls whose history is not the previous call's + appends


def raw_calls(messages: list[Message], count: Count, cap: int, max_turns: int | None = None) -> list[list[Message]]:
    """The raw history of every model call of the session that fits the budget, in order."""
    calls = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        history = messages[:i]
        if count(history) > cap or (max_turns is not None and len(calls) >= max_turns):
            break
        calls.append(history)
    return calls


def replay_policy(instance_id: str, raw: list[list[Message]], policy) -> ReplayedSession:
    policy.reset()
    sent = [policy.sent(history) for history in raw]
    edited = [t for t in range(1, len(sent)) if not extends(sent[t - 1], sent[t])]
    return ReplayedSession(instance_id, policy.name, raw, sent, edited)


def extends(before: list[Message], after: list[Message]) -> bool:
    """``after`` is ``before`` with messages appended (nothing before them changed)."""
    if len(after) < len(before):
        return False
    return all(_same(a, b) for a, b in zip(before, after))


def _same(a: Message, b: Message) -> bool:
    return a is b or a.model_dump(exclude={"id"}) == b.model_dump(exclude={"id"})


def wire(messages: list[Message]) -> list[dict]:
    """The messages as an OpenAI-style request body carries them (no ids: they never render)."""
    return [m.model_dump(exclude_none=True, exclude={"id"}) for m in messages]
