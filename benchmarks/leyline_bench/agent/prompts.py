"""The agent's own system prompt, per served model.

Leyline's tools message (``leyline_sdk.tools_prompt``) comes first in every prompt and names the call
markers in one line. The bundled default model was trained on that layout, so its agent gets the
training prompt. A model that was not (Qwen2.5-Coder knows its own ``<tool_call>`` tags) needs the
markers shown in a whole example call, and told to stop after it: measured on the 1.5B's held-out
tasks, the training prompt gave no call in Leyline's format at all (it described calls in prose or in
JSON code blocks), and a prompt that said "always start by calling a tool" made it call a tool in
every reply and never answer.
"""

from __future__ import annotations

from leyline_training.transcripts import SYSTEM_PROMPT

CALL_FORMAT_PROMPT = (
    "You are a careful agent working in a software repository. You do not know its files, keys, tests or "
    "values: find them with the tools above.\n\n"
    "To call a tool, reply with only the call, written exactly like this, with the markers:\n"
    '<|tool_call|>{"name": "kv_get", "arguments": {"key": "db.host"}}<|end_tool_call|>\n'
    "The result comes back in the next message. Read it: if it answers the question, reply with a short "
    "answer that quotes the exact values, and no tool call. If it is an error or not enough, call a tool "
    "again with a corrected call."
)

SYSTEM_PROMPTS = {
    "trained": SYSTEM_PROMPT,  # what the bundled default model was trained on
    "call-format": CALL_FORMAT_PROMPT,  # for models that were not: the call format shown by example
}
