"""Copy and recall drills: short conversations whose every answer is copied from the context.

The agent transcripts ask for copying only once or twice each (the final answer quotes a tool
result; a call's arguments quote the task), and a small model trained on a few million of their
tokens learned the template but not to copy names and values it has never seen. Drills make
copying dense, so the attention patterns that copy (match a token earlier in the context, emit
what followed it) get a gradient on nearly every assistant token:

* ``echo``: repeat the user's text exactly (names, numbers, paths, test ids);
* ``recall``: read a record with a tool call, then answer several questions about it by
  quoting the value of a key;
* ``compute``: turn the user's expression into a calculator call, then quote its result.

Text drills alone did not teach copying (held-out echo top-1 stayed near 0.3 after 1.7M drill
tokens): in text the same few tokens (``_``, ``-``, digits) recur, so "find the previous
occurrence of this token and emit what followed" is ambiguous, and the circuit that does it
gets little clean signal. :func:`.corpus.token_echo` gives it that signal: the same chat frame, but
the user's text is a run of random distinct token ids, so a copy is the only way to predict
the reply and every assistant token is unambiguous. Its user tokens are unpredictable by
construction and carry no loss (class :data:`.corpus.CLS_NOISE`).

Values are drawn per drill (made-up names as well as the split's nouns, numbers of every length),
so nothing can be memorised. A drill is a pure function of ``(seed, split)``.
"""

from __future__ import annotations

import json
import random
import string

from leyline_sdk.protocol import FunctionCall, Message, ToolCall

from . import names as N
from .custom_tools import make_custom_tool_task
from .tools import TOOLS, calculator
from .writing_systems import script_echo

DRILL_KINDS = ("echo", "recall", "compute")


def _made_up_word(rng: random.Random) -> str:
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    return "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))


def _name(rng: random.Random, split: str) -> str:
    word = _made_up_word(rng) if rng.random() < 0.5 else rng.choice(N.nouns(split))
    return rng.choice([word, f"{word}-{rng.choice(N.SERVICE_SUFFIXES)}", f"{word}_{rng.choice(N.VERBS)}",
                       f"{rng.choice(N.VERBS)}_{word}", f"team-{word}", f"{word}-{rng.randint(1, 99):02d}"])


def _number(rng: random.Random) -> str:
    digits = rng.randint(1, 6)
    value = str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))
    if rng.random() < 0.25:
        value += "." + "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 4)))
    return value


def _value(rng: random.Random, split: str) -> str:
    roll = rng.random()
    if roll < 0.5:
        return _number(rng)
    if roll < 0.85:
        return _name(rng, split)
    return rng.choice(N.REGIONS + N.LOG_LEVELS)


def _item(rng: random.Random, split: str) -> str:
    roll = rng.random()
    if roll < 0.35:
        return _number(rng)
    if roll < 0.75:
        return _name(rng, split)
    if roll < 0.9:
        return f"test_{rng.choice(N.VERBS)}_{_made_up_word(rng)}_{rng.choice(N.TEST_CASES)}"
    return f"src/{_made_up_word(rng)}/{_name(rng, split).replace('-', '_')}.py"


def _call(n: int, name: str, args: dict) -> ToolCall:
    return ToolCall(id=f"call_{n}", function=FunctionCall(name=name, arguments=json.dumps(args)))


def _echo(rng: random.Random, split: str) -> list[Message]:
    messages = [Message(role="system", content=ECHO_PROMPT)]
    for _ in range(rng.randint(2, 5)):
        text = rng.choice([" ", ", ", "\n"]).join(_item(rng, split) for _ in range(rng.randint(2, 10)))
        messages += [Message(role="user", content=text), Message(role="assistant", content=text)]
    return messages


def _recall(rng: random.Random, split: str) -> list[Message]:
    keys = rng.sample(N.ATTRS, rng.randint(4, 10)) if rng.random() < 0.5 else list(
        dict.fromkeys(_name(rng, split).replace("-", "_") for _ in range(rng.randint(4, 10))))
    record = {k: _value(rng, split) for k in keys}
    sep = rng.choice([": ", " = "])
    path = f"config/{_name(rng, split)}.{rng.choice(['yaml', 'ini', 'conf'])}"
    messages = [Message(role="system", content="Answer from the files; quote values exactly.\n\n"
                        + "\n".join(json.dumps(t["function"], sort_keys=True) for t in TOOLS[2:3])),
                Message(role="user", content=f"Read {path}.")]
    messages.append(Message(role="assistant", content="", tool_calls=[_call(0, "read_file", {"path": path})]))
    messages.append(Message(role="tool", content="\n".join(f"{k}{sep}{v}" for k, v in record.items()) + "\n",
                            tool_call_id="call_0", name="read_file"))
    for key in rng.sample(keys, min(len(keys), rng.randint(3, 6))):
        question = rng.choice(["What is {k}?", "And {k}?", "{k}?", "What is the value of {k}?"]).format(k=key)
        answer = rng.choice(["{k} is {v}.", "{v}", "{k}{s}{v}", "The value of {k} is {v}."]).format(
            k=key, v=record[key], s=sep)
        messages += [Message(role="user", content=question), Message(role="assistant", content=answer)]
    return messages


def _expression(rng: random.Random) -> str:
    terms = [_number(rng) if rng.random() < 0.3 else str(rng.randint(2, 999)) for _ in range(rng.randint(2, 4))]
    out = terms[0]
    for term in terms[1:]:
        out += f" {rng.choice('+-*')} {term}"
    return out


def _compute(rng: random.Random, split: str) -> list[Message]:
    messages = [Message(role="system", content="Use the calculator and quote its result.\n\n"
                        + json.dumps(TOOLS[0]["function"], sort_keys=True))]
    for n in range(rng.randint(2, 4)):
        expr = _expression(rng)
        result = calculator(expr)
        messages.append(Message(role="user", content=rng.choice(["What is {e}?", "Compute {e}.", "{e}"]).format(e=expr)))
        messages.append(Message(role="assistant", content="", tool_calls=[_call(n, "calculator", {"expression": expr})]))
        messages.append(Message(role="tool", content=result, tool_call_id=f"call_{n}", name="calculator"))
        messages.append(Message(role="assistant", content=rng.choice(["{r}", "It is {r}.", "{e} = {r}."]).format(
            r=result, e=expr)))
    return messages


_MAKERS = {"echo": _echo, "recall": _recall, "compute": _compute}


def drill_of_kind(kind: str, seed: int, split: str = "test") -> list[Message]:
    """One drill of a given kind (the copying probe's), a pure function of ``(kind, seed, split)``."""
    return _MAKERS[kind](random.Random(f"drill:{kind}:{split}:{seed}"), split)


ECHO_PROMPT = "Repeat exactly what the user writes, nothing else."


def make_drill(seed: int, split: str = "train") -> list[Message]:
    rng = random.Random(f"drill:{split}:{seed}")
    return _MAKERS[rng.choice(DRILL_KINDS)](rng, split)


def make_script_drill(seed: int, split: str = "train") -> tuple[list[Message], bool]:
    """A copy drill in another writing system (:mod:`.writing_systems`): an echo (half of them) or a
    custom-tool call whose name is in that script. Returns the messages and whether it is an echo
    (whose user text is random: no loss)."""
    rng = random.Random(f"script-drill:{split}:{seed}")
    if rng.random() < 0.5:
        return script_echo(rng, ECHO_PROMPT), True
    task = make_custom_tool_task(rng, split, foreign=True)
    return task.messages + task.solution, False
