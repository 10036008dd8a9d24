"""The tokenizer's incremental text against decoding every token again (the tokenizer library is the oracle)."""

import random

import pytest

from leyline_runtime.model import DEFAULT_MODEL_DIR
from leyline_runtime.text.tokenizer import REPLACEMENT_CHAR, ChatTokenizer, IncrementalText

TEXTS = ["café ✓ ok", "naïve 日本語のテキスト 🙂🚀 done", "emoji 👩‍👩‍👧 ZWJ, math ∑∫ and Ω", "plain ascii, digits 12345"]


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")


def check_stream(tok: ChatTokenizer, ids: list[int]) -> None:
    text = IncrementalText(tok.decode)
    pieces = []
    for k, token in enumerate(ids, 1):
        pieces.append(text.push(token))
        full = tok.decode(ids[:k])
        assert full.startswith(text.text) and text.text == "".join(pieces) and text.latest == full
        assert not text.text.endswith(REPLACEMENT_CHAR)
        if not full.endswith(REPLACEMENT_CHAR):  # every character whole: nothing may be left out
            assert text.text == full


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_of_encoded_text_equals_the_full_decode(tok, text):
    ids = tok.encode(text)
    check_stream(tok, ids)


def test_incremental_text_of_random_tokens_equals_the_full_decode(tok):
    # random ids split characters anywhere, make invalid byte runs and include special tokens
    rng = random.Random(0)
    for _ in range(40):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 60))]
        check_stream(tok, ids)


def test_incremental_text_holds_a_split_character_back(tok):
    ids = tok.encode("🙂")
    assert len(ids) > 1  # byte-level BPE: the emoji's four bytes are not one token here
    text = IncrementalText(tok.decode)
    assert [text.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert text.push(ids[-1]) == "🙂"


def byte_vocab(*pieces: bytes):
    """A decode over a made-up byte-level vocabulary (id = index of its bytes)."""
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_latest_is_the_full_decode_and_text_waits_for_whole_characters():
    # "STOP" followed by the first byte of a three-byte character, then the rest of it
    decode = byte_vocab(b"ab", b"STOP\xe6", b"\x97\xa5", b"\x80")
    text = IncrementalText(decode)
    for k, token in enumerate([0, 1, 2, 3, 3, 0], 1):
        text.push(token)
        assert text.latest == decode([0, 1, 2, 3, 3, 0][:k])
    assert text.text == decode([0, 1, 2, 3, 3, 0]) == "abSTOP日\ufffd\ufffdab"
    held = IncrementalText(decode)
    held.push(0), held.push(1)
    assert held.text == "ab" and held.latest == "abSTOP\ufffd"  # a stop string is seen before the character completes
