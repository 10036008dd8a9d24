"""Token ids in, text deltas out: what may be sent to a streaming client now.

The final message is what the runtime makes of the whole generation: text cut
at a stop string, tool-call blocks parsed out. A delta is only sent once no
later token can take it back, so everything sent is a prefix of the final
content. Held back: an incomplete UTF-8 character, anything from the
tool-call token on (tool calls go out whole at the end), and the last few
characters that might still turn into a stop string. Text that merely spells
the markup is content like any other. The text grows by
:class:`~leyline_runtime.text.tokenizer.IncrementalText` (a short window per token).
"""

from __future__ import annotations

from leyline_runtime.text.tokenizer import REPLACEMENT_CHAR, ChatTokenizer, IncrementalText


class DeltaDecoder:
    def __init__(self, tokenizer: ChatTokenizer, stop_strings: list[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stop_strings if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.reply = IncrementalText(tokenizer.decode)
        self.sent = ""
        self.closed = False  # a stop string or tool call was seen: nothing more streams

    def push(self, token_id: int) -> str:
        """The new safe text after ``token_id`` (may be empty)."""
        if self.closed or token_id == self.tokenizer.end_id:
            return ""
        if token_id == self.tokenizer.tool_call_id:
            self.closed = True
            return ""
        self.reply.push(token_id)
        text = self.reply.latest
        safe = self._safe_length(text)
        if safe <= len(self.sent):
            return ""
        delta = text[len(self.sent):safe]
        self.sent = text[:safe]
        return delta

    def finish(self, final_content: str) -> str:
        """What is left to send once the final content is known."""
        if not final_content.startswith(self.sent):
            return ""  # cannot happen by construction; never send a contradiction
        rest = final_content[len(self.sent):]
        self.sent = final_content
        return rest

    def _safe_length(self, text: str) -> int:
        cut = len(text)
        for marker in self.stops:
            at = text.find(marker)
            if at >= 0:
                cut = min(cut, at)
                self.closed = True
        if self.closed:
            return cut
        cut -= self.hold
        while cut > 0 and text[cut - 1] == REPLACEMENT_CHAR:  # maybe part of a character still to come
            cut -= 1
        return max(cut, 0)
