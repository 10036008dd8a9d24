"""The action of a generated assistant turn, as an agent framework would execute it, and its comparison.

A turn of the shipped sessions is mini-swe-agent prose (``THOUGHT: ...``) and one tool call; rendered
with a model's chat template the call is the template's tool-call block (Qwen2.5:
``<tool_call>{"name": "bash", "arguments": {"command": ...}}</tool_call>``; the quick model's template:
``<|tool_call|>...<|end_tool_call|>``). A model may also answer as mini-swe-agent's text protocol
does, a fenced ``bash`` block; that counts as a ``bash`` call. Generation stops at the end of the first
action (:func:`action_stops`), so the prose before it is the model's and only the action is compared:

* *same action*: the same tool and the same arguments, whitespace runs collapsed (a command that
  differs by a space still runs the same);
* *same command word*: the same tool and, for a shell command, the same program — its first word once
  leading ``cd DIR &&`` steps and ``VAR=value`` assignments are skipped (``sed`` vs ``grep``: the agent
  took a different kind of step).

A turn with no complete action (prose only, or cut at the token cap) has none; two such turns are the
same action when their prose is the same, whitespace collapsed.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

CALL = re.compile(r"(?:<tool_call>|<\|tool_call\|>)\s*(.*?)\s*(?:</tool_call>|<\|end_tool_call\|>)", re.S)
FENCE = re.compile(r"```(?:bash|sh)[ \t]*\n(.*?)```", re.S)
CLOSERS = ("</tool_call>", "<|end_tool_call|>")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", ";", "||"}


@dataclass(frozen=True)
class Action:
    tool: str | None  # None: the turn has no complete action
    arguments: str  # the command (or the arguments as canonical JSON; the prose where there is no action)
    word: str | None  # the command word (the tool's name for a tool without a command)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def command_word(command: str) -> str:
    """The program a shell command runs first, past ``cd DIR &&`` steps and variable assignments."""
    try:
        words = shlex.split(command, posix=True)
    except ValueError:  # an unbalanced quote: the plain split still finds the first word
        words = command.split()
    k = 0
    while k < len(words):
        if words[k] == "cd":
            k += 2
            while k < len(words) and words[k] in SEPARATORS:
                k += 1
        elif ASSIGNMENT.match(words[k]) or words[k] in SEPARATORS:
            k += 1
        else:
            return words[k].rsplit("/", 1)[-1]
    return ""


def action_of(text: str) -> Action:
    """The first complete action in a generated turn's text."""
    call, fence = CALL.search(text), FENCE.search(text)
    if call and (not fence or call.start() < fence.start()):
        try:
            body = json.loads(call.group(1))
        except json.JSONDecodeError:
            return Action("?", _collapse(call.group(1)), "?")  # a malformed call, compared as its text
        if not isinstance(body, dict):
            return Action("?", _collapse(call.group(1)), "?")
        name, args = str(body.get("name")), body.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if isinstance(args, dict) and set(args) == {"command"}:
            command = str(args["command"])
            return Action(name, _collapse(command), command_word(command))
        return Action(name, json.dumps(args, sort_keys=True), name)
    if fence:
        command = fence.group(1)
        return Action("bash", _collapse(command), command_word(command))
    return Action(None, _collapse(text), None)


def same_word(a: Action, b: Action) -> bool:
    """The same tool and command word; two turns without an action only where their prose is the same (no
    action is not a shared command)."""
    if a.tool is None or b.tool is None:
        return a == b
    return a.tool == b.tool and a.word == b.word


def action_stops(tokenizer, stop: set[int]) -> set[int]:
    """``stop`` and the tokens that close a tool call, where the vocabulary has them as one token."""
    out = set(stop)
    for closer in CLOSERS:
        ids = tokenizer(closer, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            out.add(ids[0])
    return out
