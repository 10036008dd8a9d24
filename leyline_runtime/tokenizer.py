"""Byte-level BPE tokenizer (``tokenizers``) plus the chat template's special ids."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from leyline_sdk.protocol import Message

from . import chat_template as tpl


class ChatTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        missing = [t for t in tpl.SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks the chat template's special tokens: {missing}")
        self.end_id = self.token_id(tpl.END)
        self.role_ids = {role: self.token_id(tok) for role, tok in tpl.ROLE_TOKENS.items()}
        self.special_ids = {self.token_id(t) for t in tpl.SPECIAL_TOKENS}

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
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def encode_message(self, message: Message) -> list[int]:
        """Header + body + end marker; never merges with a neighbour."""
        return [self.role_ids[message.role], *self.encode(tpl.render_body(message)), self.end_id]

    def encode_messages(self, messages: list[Message]) -> list[list[int]]:
        return [self.encode_message(m) for m in messages]
