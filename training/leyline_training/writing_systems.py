"""Text in other writing systems: copying at the level of UTF-8 bytes.

The tokenizer is byte-level BPE trained on English-and-Python text, so a character
outside ASCII is two to four single-byte tokens (``你`` is ``ä ½ ł``). The rest of
the corpus almost never contains them, and the token echo drills leave single bytes
out of their pool, so run 8 could not copy one: asked for a customer named ``你好啊集团``
(LangChain's standard test) or ``тип`` it wrote ``賰鿰迅腰`` and ``腰煰酰腰`` (the same
few characters whatever it was given; 0 of 42 names in CJK, kana, Cyrillic and Greek in a probe).

Byte copying is also the harder kind: in ``你好啊集团`` the byte ``å`` occurs three
times, followed each time by a different byte, so "find the previous occurrence and
emit what followed it" is ambiguous unless the copy keeps its place. These drills
give that signal densely, in two forms:

* :func:`script_echo`: repeat the user's text, runs of characters drawn uniformly from
  whole blocks of eleven scripts (too many to memorise) between ASCII words and numbers;
* a custom-tool task whose name value is :func:`script_name` (``make_custom_tool_task(...,
  foreign=True)``), the way API users ask (``Create a customer named '…'``).

:func:`.drills.make_script_drill` draws one of the two. A drill is a pure function of its
random generator.
"""

from __future__ import annotations

import random

from leyline_sdk.protocol import Message

# Code point ranges (inclusive) of letters, 2-3 UTF-8 bytes each.
SCRIPT_BLOCKS: dict[str, tuple[int, int]] = {
    "cjk": (0x4E00, 0x9FFF),
    "hiragana": (0x3041, 0x3096),
    "katakana": (0x30A1, 0x30FA),
    "hangul": (0xAC00, 0xD7A3),
    "cyrillic": (0x0410, 0x044F),
    "greek": (0x03B1, 0x03C9),
    "arabic": (0x0621, 0x064A),
    "hebrew": (0x05D0, 0x05EA),
    "devanagari": (0x0905, 0x0939),
    "thai": (0x0E01, 0x0E2E),
    "latin1": (0x00C0, 0x00FF),
}
# Drawn as often as all the others together: the script of LangChain's and most users' examples.
_SCRIPT_WEIGHTS = [10 if s == "cjk" else 1 for s in SCRIPT_BLOCKS]


def script_word(rng: random.Random, script: str | None = None) -> str:
    """1-8 characters of one script (drawn when not given)."""
    script = script or rng.choices(list(SCRIPT_BLOCKS), _SCRIPT_WEIGHTS)[0]
    lo, hi = SCRIPT_BLOCKS[script]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))


def script_name(rng: random.Random) -> str:
    """A name as users write one in their script: one or two words, sometimes with a Latin suffix."""
    script = rng.choices(list(SCRIPT_BLOCKS), _SCRIPT_WEIGHTS)[0]
    words = [script_word(rng, script) for _ in range(rng.choice([1, 1, 1, 2]))]
    if rng.random() < 0.2:
        words.append(rng.choice(["Group", "Ltd", "GmbH", "Inc", "Co"]))
    return " ".join(words)


def script_echo(rng: random.Random, prompt: str) -> list[Message]:
    """Rounds of user text in other scripts (with ASCII between) and the reply that repeats it."""
    messages = [Message(role="system", content=prompt)]
    for _ in range(rng.randint(2, 5)):
        parts = []
        for _ in range(rng.randint(1, 6)):
            roll = rng.random()
            parts.append(script_word(rng) if roll < 0.75 else str(rng.randint(0, 9999)) if roll < 0.875
                         else rng.choice(["id", "name", "to", "and", "(", ")", "-", ":"]))
        text = rng.choice([" ", ", ", " "]).join(parts)
        messages += [Message(role="user", content=text), Message(role="assistant", content=text)]
    return messages
