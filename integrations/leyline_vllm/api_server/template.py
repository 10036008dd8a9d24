"""Sessions' token ids on vLLM: the model's own chat template, via vLLM's tokenizer.

Each message's text is what Leyline's template contract puts in a message
body (tool calls as ``<|tool_call|>{json}<|end_tool_call|>`` text, from
``leyline_sdk.tools_prompt``); the model's chat template wraps it. A message's
token range (segment) is where rendering the history up to it ends, so it is
exact for templates that render a history as the concatenation of its
messages (the usual case; a template that does not fails loudly here).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from leyline_sdk.errors import ValidationFailed
from leyline_sdk.protocol import Message
from leyline_sdk.tools_prompt import TOOLS_MESSAGE_ID, TOOLS_PREAMBLE, render_tool_call


def message_dict(message: Message) -> dict:
    body = message.content + "".join(render_tool_call(c) for c in message.tool_calls or [])
    out = {"role": message.role, "content": body}
    if message.name:
        out["name"] = message.name
    return out


class ChatRenderer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.control_tokens = sorted({t.content for t in decoder.values() if getattr(t, "special", False)}
                                     | set(getattr(tokenizer, "all_special_tokens", []) or []), key=len, reverse=True)

    def check_content(self, messages: list[Message]) -> None:
        """Content is data: text that the template would turn into control tokens is refused (422).
        (The chat template tokenizes its rendered text as a whole, so it cannot keep such text literal.)"""
        for i, m in enumerate(messages):
            content = m.content
            if m.id == TOOLS_MESSAGE_ID and content.startswith(TOOLS_PREAMBLE):
                # Leyline's own tools prompt (leyline_sdk.tools_prompt) names the call markers on purpose,
                # in its first lines only: the tools' names and descriptions after them are data
                content = content[len(TOOLS_PREAMBLE):]
            for text in (content, m.name or ""):
                hit = next((t for t in self.control_tokens if t and t in text), None)
                if hit is not None:
                    raise ValidationFailed(f"message {i} contains the model's control token {hit!r}; "
                                           "the vLLM plugin does not accept control tokens in message text")

    def ids(self, messages: list[Message], generation_prompt: bool = False) -> list[int]:
        return self.encode(messages, generation_prompt)[0]

    def encode(self, messages: list[Message], generation_prompt: bool = False,
               bounds_at: Sequence[int] = ()) -> tuple[list[int], list[int]]:
        """The history's token ids, and for each ``k`` in ``bounds_at`` the number of those tokens that
        render ``messages[:k]`` — from one tokenization of the rendered text (its character offsets).

        The text is tokenized as the chat template's own ``tokenize=True`` does (no added special
        tokens), once: a 2k-token history costs about 2.5 ms to tokenize on a small CPU."""
        if not messages:
            return [], [0 for _ in bounds_at]
        self.check_content(messages)
        dicts = [message_dict(m) for m in messages]
        full = self.tokenizer.apply_chat_template(dicts, add_generation_prompt=generation_prompt, tokenize=False)
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=bool(bounds_at))
        ids = list(enc["input_ids"])
        if not bounds_at:
            return ids, []
        ends = [end for _, end in enc["offset_mapping"]]
        bounds = []
        for k in bounds_at:
            text = self.tokenizer.apply_chat_template(dicts[:k], tokenize=False) if k else ""
            if not full.startswith(text):
                raise ValueError("the chat template does not render a history as the concatenation of its messages")
            end = bisect.bisect_right(ends, len(text))  # tokens that end inside this prefix
            if end and ends[end - 1] != len(text) and end < len(ends):
                raise ValueError("a message boundary falls inside a token")
            bounds.append(end)
        return ids, bounds

    def encode_messages(self, messages: list[Message]) -> list[list[int]]:
        """Each message's tokens in the rendered history (what ``context_management``'s edits count:
        :class:`leyline_runtime.api.context_edits.MessageTokens`)."""
        ids, ends = self.encode(messages, bounds_at=range(1, len(messages) + 1))
        return [ids[a:b] for a, b in zip([0, *ends[:-1]], ends)]

    def segments(self, messages: list[Message]) -> list[tuple[int, int]]:
        """Token range of every message: where the rendered text of each prefix of the history ends."""
        _, ends = self.encode(messages, bounds_at=range(1, len(messages) + 1))
        return list(zip([0, *ends[:-1]], ends))
