"""The player that writes a task's worked solution: assistant tool calls with the tools' real outputs.

A task kind (:mod:`.task_kinds`) returns a :data:`Spec`: the user's question, the expected answer, what an
answer must and must not contain, and a ``solve`` that plays the solution on a :class:`Play`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from leyline_sdk.protocol import FunctionCall, Message, ToolCall

from .tools import execute
from .world import World


class Play:
    """Plays a solution: appends assistant calls with the tools' real outputs."""

    def __init__(self, world: World, rng: random.Random, messages: list[Message]):
        self.world, self.rng, self.messages = world, rng, messages
        self.n_calls = 0
        self.named = rng.random() < 0.85  # most frameworks send the tool name with the result

    def call(self, text: str, *calls: tuple[str, dict]) -> list[str]:
        tool_calls = []
        for name, args in calls:
            tool_calls.append(ToolCall(id=f"call_{self.n_calls}",
                                       function=FunctionCall(name=name, arguments=json.dumps(args))))
            self.n_calls += 1
        self.messages.append(Message(role="assistant", content=text, tool_calls=tool_calls))
        outs = []
        for tc, (name, args) in zip(tool_calls, calls):
            out = execute(self.world, name, args)
            self.messages.append(Message(role="tool", content=out, tool_call_id=tc.id,
                                         name=name if self.named else None))
            outs.append(out)
        return outs

    def one(self, text: str, name: str, args: dict) -> str:
        return self.call(text, (name, args))[0]

    def answer(self, text: str) -> None:
        self.messages.append(Message(role="assistant", content=text))


def say(rng: random.Random, options: list[str], p_empty: float = 0.4) -> str:
    return "" if rng.random() < p_empty else rng.choice(options)


# (user text, expected, required, forbidden, solve); a kind returns None when the world cannot host it
# (the caller then picks another).
Spec = tuple[str, str, list[tuple[str, ...]], list[str], Callable[[Play], None]]
