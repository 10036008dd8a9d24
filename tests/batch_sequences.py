"""Recorded edit sequences for the batch planner's three callers (tests/sdk/test_batch_plan.py).

A sequence is the list of histories an agent hands over at successive model
calls; each step is one kind of edit an agent framework makes: a retry, tool
outputs dropped (and tool inputs cleared), a truncation, a summary, appends,
id-only changes, and histories edited in more places than one batch may carry.
Generated deterministically from a seed, so a failure names its sequence.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from leyline_sdk.protocol import MAX_DIRECTIVES, FunctionCall, Message, ToolCall

History = list[Message]


class _Ids:
    def __init__(self, prefix: str) -> None:
        self.prefix, self.n = prefix, 0

    def __call__(self) -> str:
        self.n += 1
        return f"{self.prefix}{self.n}"


def _turn(rng: random.Random, new_id: _Ids, k: int) -> History:
    """One user turn: a question, maybe a tool unit (1-3 calls and their results), an answer."""
    out = [Message(role="user", content=f"question {k}: {rng.randrange(10**6)}", id=new_id())]
    if rng.random() < 0.6:
        calls = [ToolCall(id=f"c{new_id()}", function=FunctionCall(
            name=rng.choice(["search", "read", "run"]), arguments=f'{{"q": "{rng.randrange(999)}"}}'))
            for _ in range(rng.randint(1, 3))]
        out.append(Message(role="assistant", content="", tool_calls=calls, id=new_id()))
        out += [Message(role="tool", content=f"output of {c.function.name}: " + "x" * rng.randint(5, 60),
                        tool_call_id=c.id, name=c.function.name, id=new_id()) for c in calls]
    out.append(Message(role="assistant", content=f"answer {k}", id=new_id()))
    return out


def _append(rng: random.Random, h: History, new_id: _Ids) -> History:
    return h + _turn(rng, new_id, len(h))


def _retry(rng: random.Random, h: History, new_id: _Ids) -> History:
    """The last answer is regenerated (a new message in its place)."""
    return h[:-1] + [Message(role="assistant", content=f"retried {rng.randrange(999)}", id=new_id())]


def _drop_tool_outputs(rng: random.Random, h: History, new_id: _Ids) -> History:
    """Older tool results cleared (their ids kept); sometimes their calls' inputs too."""
    tools = [i for i, m in enumerate(h) if m.role == "tool" and m.content != "[cleared]"]
    clear = set(tools[: max(1, len(tools) - 1)]) if tools else set()
    inputs = rng.random() < 0.5
    out = []
    for i, m in enumerate(h):
        if i in clear:
            m = m.model_copy(update={"content": "[cleared]"})
        elif inputs and m.tool_calls and any(j in clear for j in range(i + 1, i + 1 + len(m.tool_calls))):
            m = m.model_copy(update={"tool_calls": [c.model_copy(update={"function": FunctionCall(
                name=c.function.name, arguments="{}")}) for c in m.tool_calls]})
        out.append(m)
    return out


def _truncate(rng: random.Random, h: History, new_id: _Ids) -> History:
    """The oldest messages after the system prompt dropped, from a user message on."""
    users = [i for i, m in enumerate(h) if m.role == "user"]
    cut = users[min(len(users) - 1, rng.randint(1, 2))] if len(users) > 1 else 1
    return h[:1] + h[cut:]


def _summarise(rng: random.Random, h: History, new_id: _Ids) -> History:
    """A run of old messages replaced by one summary message."""
    users = [i for i, m in enumerate(h) if m.role == "user"]
    end = users[-1] if len(users) > 1 else len(h) - 1
    summary = Message(role="system", content=f"summary of {end - 1} messages", id=new_id())
    return h[:1] + [summary] + h[end:]


def _rename(rng: random.Random, h: History, new_id: _Ids) -> History:
    """Some messages get new ids (a framework re-wrapped them); nothing renders differently."""
    picks = set(rng.sample(range(1, len(h)), k=min(len(h) - 1, rng.randint(1, 3))))
    return [m.model_copy(update={"id": new_id()}) if i in picks else m for i, m in enumerate(h)]


EDITS: dict[str, Callable[[random.Random, History, _Ids], History]] = {
    "append": _append, "retry": _retry, "drop_tool_outputs": _drop_tool_outputs,
    "truncate": _truncate, "summarise": _summarise, "rename": _rename,
}


def sequence(seed: int, steps: int = 5) -> tuple[list[str], list[History]]:
    """``(edit kinds, histories)``: a start of 2-4 turns, then ``steps`` edits, each followed by an append."""
    rng = random.Random(seed)
    new_id = _Ids(f"s{seed}-")
    h: History = [Message(role="system", content="You are a careful agent.", id=new_id())]
    for k in range(rng.randint(2, 4)):
        h += _turn(rng, new_id, k)
    kinds, histories = [], [h]
    for _ in range(steps):
        kind = rng.choice(sorted(EDITS))
        h = EDITS[kind](rng, h, new_id)
        if kind != "append" and rng.random() < 0.5:  # the next model call carries a new question too
            h = h + [Message(role="user", content="and then?", id=new_id())]
        kinds.append(kind)
        histories.append(h)
    return kinds, histories


def over_limit(seed: int) -> tuple[list[str], list[History]]:
    """Every user message rewritten in a history with more turns than one batch may edit."""
    n = MAX_DIRECTIVES + 1 + seed
    h = [Message(role="system", content="sys", id="sys")]
    for k in range(n):
        h += [Message(role="user", content=f"q{k}", id=f"u{k}"), Message(role="assistant", content=f"a{k}", id=f"a{k}")]
    edited = [m.model_copy(update={"content": m.content + "!"}) if m.role == "user" else m for m in h]
    return ["rewrite_all"], [h, edited, edited + [Message(role="user", content="next", id="next")]]


def recorded_sequences() -> list[tuple[str, list[str], list[History]]]:
    """60 generated sequences and 2 over the directive limit: ``(name, kinds, histories)``."""
    out = [(f"seq{seed}", *sequence(seed)) for seed in range(60)]
    out += [(f"over_limit{seed}", *over_limit(seed)) for seed in range(2)]
    return out
