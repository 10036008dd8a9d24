"""Edits of an exact token size: pad a message so its tokens grow by exactly δ.

Position stress needs edits whose token delta is exactly 1, 127, 128, 129,
1024; the edit bench needs histories of exactly N tokens. Filler is log-like
lines, then single-token words; the result is checked by re-encoding.
"""

from __future__ import annotations

from leyline_sdk.protocol import Message

from leyline_runtime.text.tokenizer import ChatTokenizer

PAD_WORD = " ok"  # one token after a space-splitting pre-tokenizer; checked, not assumed


def filler(num_lines: int, num_words: int) -> str:
    lines = "".join(f"\n[debug] step {i} done" for i in range(num_lines))
    return lines + PAD_WORD * num_words


def _size(tok: ChatTokenizer, message: Message) -> int:
    return len(tok.encode_message(message))


def grow(tok: ChatTokenizer, message: Message, delta: int) -> Message:
    """A copy of ``message`` whose content ends with filler and whose tokens number exactly ``delta`` more."""
    if delta < 0:
        raise ValueError("grow() only adds tokens")
    if delta == 0:
        return message.model_copy()
    base = _size(tok, message)
    line_tokens = max(1, len(tok.encode(filler(1, 0))))
    lines = max(0, (delta - 8) // line_tokens)
    words = delta - lines * line_tokens
    for _ in range(32):
        cand = message.model_copy(update={"content": message.content + filler(lines, max(0, words))})
        got = _size(tok, cand) - base
        if got == delta:
            return cand
        words += delta - got
        if words < 0:
            lines, words = max(0, lines - 1), words + line_tokens
    raise ValueError(f"could not grow a {message.role} message by exactly {delta} tokens")


def token_delta(tok: ChatTokenizer, old: list[Message], new: list[Message]) -> int:
    return sum(map(len, tok.encode_messages(new))) - sum(map(len, tok.encode_messages(old)))
