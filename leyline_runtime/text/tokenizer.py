"""Byte-level BPE tokenizer (``tokenizers``) plus the chat template's special ids.

Content is data, never control: text from a request (message content, tool
names and arguments, token-unit replacements) is encoded with the special
tokens switched off, so ``<|end|>`` or ``<|system|>`` inside a tool output
become plain bytes and can never open a turn. Special ids come only from the
template's structure (role header, tool-call brackets, end marker) and from
the fixed tool-syntax line of the tools prompt (:func:`_template_pieces`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from leyline_sdk.protocol import Message
from leyline_sdk.tools_prompt import TOOLS_PREAMBLE

from leyline_runtime.text import chat_template as tpl


class ChatTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        missing = [t for t in tpl.SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks the chat template's special tokens: {missing}")
        # A copy that reads special-token strings as text (the shared one still
        # decodes generated special ids to their strings).
        self.plain = Tokenizer.from_str(tokenizer.to_str())
        self.plain.encode_special_tokens = True
        self.end_id = self.token_id(tpl.END)
        self.role_ids = {role: self.token_id(tok) for role, tok in tpl.ROLE_TOKENS.items()}
        self.tool_call_id = self.token_id(tpl.TOOL_CALL)
        self.end_tool_call_id = self.token_id(tpl.END_TOOL_CALL)
        self.special_ids = {self.token_id(t) for t in tpl.SPECIAL_TOKENS}
        # Ids a client may never send as content: the template's and any other special token of the tokenizer.
        self.control_ids = self.special_ids | {i for i, t in tokenizer.get_added_tokens_decoder().items()
                                               if t.special}
        self.longest_token_bytes = max(len(self.token_text(i).encode("utf-8", errors="replace"))
                                       for i in range(self.vocab_size) if i not in self.special_ids)

    @classmethod
    def from_file(cls, path: str | Path) -> "ChatTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_id(self, token: str) -> int:
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise KeyError(token)
        return tid

    def encode(self, text: str) -> list[int]:
        """Text as data: special-token strings in it are encoded as their plain bytes."""
        return self.plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for: part of a character when it splits one (``token_text`` shows U+FFFD)."""
        piece = self.tokenizer.id_to_token(token_id)
        if token_id in self.control_ids or piece is None or any(c not in _BYTE_OF_CHAR for c in piece):
            return self.token_text(token_id).encode("utf-8")
        return bytes(_BYTE_OF_CHAR[c] for c in piece)

    def encode_message(self, message: Message) -> list[int]:
        """Header + body + end marker; never merges with a neighbour."""
        body: list[int] = []
        for piece, special in _template_pieces(message):
            body.extend([self.token_id(piece)] if special else self.encode(piece))
        return [self.role_ids[message.role], *body, self.end_id]

    def encode_messages(self, messages: list[Message]) -> list[list[int]]:
        return [self.encode_message(m) for m in messages]


def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE spells each byte as one printable character (GPT-2's table); this reads it back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return {c: b for b, c in chars.items()}


_BYTE_OF_CHAR = _byte_of_char()


def _template_pieces(message: Message) -> list[tuple[str, bool]]:
    """The body as ``(text, is_special)`` pieces; concatenated they are :func:`tpl.render_body`."""
    pieces: list[tuple[str, bool]] = []
    content = tpl.render_body(message.model_copy(update={"tool_calls": None}))
    if message.role == "system" and content.startswith(TOOLS_PREAMBLE):
        # The tools prompt's syntax line shows the model the real brackets.
        head, rest = content[:len(TOOLS_PREAMBLE)], content[len(TOOLS_PREAMBLE):]
        at = head.index(tpl.TOOL_CALL)
        end = head.index(tpl.END_TOOL_CALL)
        pieces += [(head[:at], False), (tpl.TOOL_CALL, True), (head[at + len(tpl.TOOL_CALL):end], False),
                   (tpl.END_TOOL_CALL, True), (rest, False)]
    else:
        pieces.append((content, False))
    for call in message.tool_calls or []:
        pieces += [(tpl.TOOL_CALL, True), (tpl.tool_call_payload(call), False), (tpl.END_TOOL_CALL, True)]
    return [(text, special) for text, special in pieces if text or special]


REPLACEMENT_CHAR = "\ufffd"  # what decoding puts for bytes that are not (yet) a whole character


class IncrementalText:
    """The text of a growing list of generated tokens, as decoding them all would give it.

    Each token decodes a short window, not the whole list: decoding everything again per token
    cost 0.7 ms at 8,000 tokens, and a generation's text is read after every token on the engine
    thread. ``text`` is committed at token boundaries where the decoded text ended in a whole
    character; the window starts one commit earlier (so it always holds tokens already decoded)
    and runs to the newest token, and the new text is what decoding the window adds to decoding
    it without the uncommitted tokens, so whatever a decoder does at the start of a piece cancels
    out (the approach of vLLM's and TGI's incremental detokenizers). Tokens whose text still ends
    in a replacement character (a character not yet whole, or bytes that never will be) stay
    uncommitted; their text so far is ``pending``, and ``latest`` is the whole decode.

    Not exact for byte-fallback tokenizers (Llama's ``<0x..>`` tokens) when byte tokens form no
    valid character: decoding a window can then join bytes that decoding everything does not (or
    the reverse), as in vLLM. A run of tokens that never ends in a whole character keeps the
    window growing (each push costs what decoding that run costs).
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.tokens: list[int] = []
        self.text = ""
        self.pending = ""  # the text of tokens[_read:], which may end in part of a character
        self._window = 0  # tokens[_window:_read] decode to the tail of text
        self._read = 0  # tokens[_read:] are not in text yet

    @property
    def latest(self) -> str:
        return self.text + self.pending

    def push(self, token_id: int) -> str:
        """Add a token; -> the text it committed (may be empty)."""
        self.tokens.append(token_id)
        before = self.decode(self.tokens[self._window: self._read])
        after = self.decode(self.tokens[self._window:])
        new = after[len(before):]
        if not new or new.endswith(REPLACEMENT_CHAR):
            self.pending = new
            return ""
        self.text += new
        self.pending = ""
        self._window, self._read = self._read, len(self.tokens)
        return new
