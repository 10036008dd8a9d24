"""Agent-like messages from the synthetic transcripts (``leyline_training``).

The transcripts are what the default model is (or will be) trained on: a
system prompt with the tool list, user tasks, assistant tool calls, real tool
outputs (file reads, test logs, errors) and final answers. Everything here is
a pure function of the seeds, so workloads and traces regenerate exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from leyline_sdk.protocol import Message

from leyline_training.transcripts import make_transcript, system_message

SPLIT = "test"  # held-out transcripts: never the ones a model trains on


@dataclass
class Round:
    """One tool round: the assistant's call and the tool's output."""

    call: Message
    output: Message

    @property
    def failed(self) -> bool:
        return self.output.content.startswith("Error")


def system() -> Message:
    return system_message()


def conversation(seed: int) -> list[Message]:
    """One transcript's messages after the system prompt (final answers included)."""
    return [m.model_copy(deep=True) for m in make_transcript(seed, SPLIT).messages[1:]]


def final_target(seed: int) -> str:
    """A short string the transcript's last answer must contain (its first required value)."""
    task = make_transcript(seed, SPLIT).tasks[-1]
    if task.required and task.required[0]:
        return task.required[0][0]
    return task.expected


def rounds(seed: int) -> list[Round]:
    """The (call, output) pairs of one transcript; parallel calls come as one round per output."""
    msgs = conversation(seed)
    out = []
    for i, m in enumerate(msgs[:-1]):
        if m.role == "assistant" and m.tool_calls and msgs[i + 1].role == "tool":
            out.append(Round(m, msgs[i + 1]))
    return out


def round_stream(start_seed: int = 0) -> Iterator[Round]:
    """Rounds of consecutive transcripts, forever."""
    seed = start_seed
    while True:
        yield from rounds(seed)
        seed += 1


def user_tasks(seed: int) -> list[Message]:
    return [m for m in conversation(seed) if m.role == "user"]
