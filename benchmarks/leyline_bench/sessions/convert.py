"""mini-swe-agent's trajectory format ("mini-swe-agent-1") into the chat Leyline's clients send.

mini-swe-agent (https://github.com/SWE-agent/mini-swe-agent) gives its model no tools: the
model answers in text with exactly one fenced bash block, the agent runs that block and
answers with a *user* message holding the result. A trajectory's ``messages`` are therefore
``system, user, (assistant, user)*``, each ``{"role", "content"}`` plus, on assistant
messages, an ``extra`` with the provider's raw response. Leyline's SDK and LangChain send
OpenAI-style tool calling instead; this module rewrites one into the other, and nothing else:

* ``system`` -> ``system``, content unchanged.
* The first ``user`` message (the task) -> ``user``, content unchanged.
* An ``assistant`` message in which mini-swe-agent's own action regex
  (:data:`ACTION_REGEX`, ``re.DOTALL``) finds exactly one bash block, i.e. one the agent ran:
  an ``assistant`` message with one tool call ``{"id": "call_<n>", "type": "function",
  "function": {"name": "bash", "arguments": json.dumps({"command": <block>})}}``, where
  ``<block>`` is the regex's group stripped of surrounding whitespace (the command the agent
  executed: it strips it too) and ``n`` counts the session's tool calls from 0. The content
  is the assistant's prose: the text with the matched fence removed, the part before it
  right-stripped, the part after it stripped, the two joined by a blank line when both are
  non-empty (whitespace around the fence is the only thing lost).
* The ``user`` message right after such an assistant message -> ``tool`` with that call's
  ``tool_call_id``, content unchanged: the ``<returncode>`` observation (outputs of 10,000
  characters or more were already elided by mini-swe-agent to their first and last 5,000
  characters plus an ``<elided_chars>`` note; the elision is kept as it is), the timeout
  message of a command that was killed, or, after the submit command, what mini-swe-agent
  recorded as the submission.
* An ``assistant`` message with no bash block or with several: the agent ran nothing, so it
  stays a plain ``assistant`` message with its full text, and the ``user`` message after it
  (mini-swe-agent's format error) stays a ``user`` message, content unchanged.
* ``extra`` (the provider's raw response: usage, the model's reasoning summary, encrypted
  reasoning) is dropped: mini-swe-agent never sent it back to the model either, its models
  send ``{"role", "content"}`` only. :func:`last_call_prompt_tokens` reads the one number
  the bench keeps from it.

Any other shape (two assistant messages in a row, a tool message with no call before it)
raises ``ValueError`` rather than being guessed at.
"""

from __future__ import annotations

import json
import re
from typing import Any

TRAJECTORY_FORMAT = "mini-swe-agent-1"
# mini-swe-agent's AgentConfig.action_regex (src/minisweagent/agents/default.py); the runs
# shipped here used it unchanged (their recorded config sets no other).
ACTION_REGEX = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
TOOL_NAME = "bash"


def bash_tool_call(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": TOOL_NAME, "arguments": json.dumps({"command": command}, ensure_ascii=False)}}


def _prose_around(text: str, match: re.Match[str]) -> str:
    before, after = text[:match.start()].rstrip(), text[match.end():].strip()
    return "\n\n".join(part for part in (before, after) if part)


def convert_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A trajectory's ``messages`` as OpenAI-style chat messages (the mapping is the module's docstring)."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        raise ValueError("a mini-swe-agent trajectory starts with a system and a user message")
    out: list[dict[str, Any]] = [{"role": "system", "content": messages[0]["content"]},
                                 {"role": "user", "content": messages[1]["content"]}]
    pending_call: str | None = None  # the id of the tool call whose result comes next
    n_calls = 0
    for index, message in enumerate(messages[2:], start=2):
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message {index}: content is {type(content).__name__}, not text")
        expected = "assistant" if index % 2 == 0 else "user"
        if role != expected:
            raise ValueError(f"message {index}: {role!r} where mini-swe-agent writes {expected!r}")
        if role == "assistant":
            actions = list(ACTION_REGEX.finditer(content))
            if len(actions) == 1:
                pending_call = f"call_{n_calls}"
                n_calls += 1
                out.append({"role": "assistant", "content": _prose_around(content, actions[0]),
                            "tool_calls": [bash_tool_call(pending_call, actions[0].group(1).strip())]})
            else:
                pending_call = None
                out.append({"role": "assistant", "content": content})
        elif pending_call is not None:
            out.append({"role": "tool", "tool_call_id": pending_call, "content": content})
            pending_call = None
        else:
            out.append({"role": "user", "content": content})
    return out


def convert_trajectory(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole ``*.traj.json`` (checked to be mini-swe-agent's format) as chat messages."""
    found = trajectory.get("trajectory_format")
    if found != TRAJECTORY_FORMAT:
        raise ValueError(f"trajectory_format is {found!r}, not {TRAJECTORY_FORMAT!r}")
    return convert_messages(trajectory["messages"])


def last_call_prompt_tokens(trajectory: dict[str, Any]) -> int | None:
    """The prompt tokens the provider counted for the session's last model call, if recorded.

    That prompt is every message before the last assistant message, in the model's own
    tokenizer (with its chat template's overhead): a real token count, where the bench has
    no tokenizer of that model offline.
    """
    for message in reversed(trajectory["messages"]):
        if message.get("role") == "assistant":
            usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
            tokens = usage.get("prompt_tokens")
            return tokens if isinstance(tokens, int) else None
    return None
