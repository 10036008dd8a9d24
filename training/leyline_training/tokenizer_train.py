"""Train the default byte-level BPE tokenizer (``tokenizers``) on the corpus.

* Pre-tokenizer: digits split one by one, then GPT-2 style ByteLevel (regex on,
  no prefix space). Single-digit numbers keep every value the model must copy
  (ports, results, test counts) made of ten well-trained tokens, so copying an
  unseen number is the same skill as copying a seen one.
* Decoder: ByteLevel, no normalizer: ``decode(encode(x)) == x`` for any text.
* Special tokens: the chat template's, in the order of ``SPECIAL_TOKENS``
  (ids 0..8). They are cut out of the training text so no merge spends
  vocabulary on their pieces.
* Training text: a seeded sample of the stdlib chunks plus rendered train
  transcripts (:func:`.corpus.rendered_documents`). A few seconds on one core.

``python -m leyline_training.tokenizer_train --out PATH`` writes it.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from leyline_sdk.protocol import FunctionCall, Message, ToolCall
from leyline_runtime.text import chat_template as tpl
from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_runtime.text.tokenizer import ChatTokenizer
from .corpus import rendered_documents

DEFAULT_OUT = DEFAULT_MODEL_DIR / "tokenizer.json"
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in tpl.SPECIAL_TOKENS))


def _pieces(documents):
    for doc in documents:
        for piece in _SPECIAL_RE.split(doc):
            if piece:
                yield piece


def build_tokenizer(vocab_size: int = 8192, *, n_transcripts: int = 2000, stdlib_chars: int = 4_000_000,
                    seed: int = 0) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(tpl.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    docs = rendered_documents(n_transcripts, stdlib_chars, seed)
    tokenizer.train_from_iterator(_pieces(docs), trainer=trainer)
    return tokenizer


def check_tokenizer(tokenizer: Tokenizer) -> dict:
    """Invariants the runtime relies on; raises AssertionError when one fails."""
    tok = ChatTokenizer(tokenizer)
    for i, special in enumerate(tpl.SPECIAL_TOKENS):
        assert tokenizer.token_to_id(special) == i, special
    samples = ["héllo wörld — ∑ 数据 🚀 \t\n  x", "def f(a, b):\n    return a + b  # ok\r\n", "",
               "   leading and trailing   ", "<|end|> literal specials <|tool_call|>", "\x00\x7f\u200b"]
    for text in samples:
        assert tok.decode(tok.encode(text)) == text, repr(text)
    call = Message(role="assistant", tool_calls=[ToolCall(id="c", function=FunctionCall(
        name="kv_get", arguments='{"key": "orchard.timeout_ms"}'))])
    ids = tok.encode_message(call)[1:-1]  # without role header and end marker
    assert ids[0] == tok.token_id(tpl.TOOL_CALL) and ids[-1] == tok.token_id(tpl.END_TOOL_CALL)
    return {"vocab_size": tokenizer.get_vocab_size(), "tool_call_tokens": len(ids),
            "tool_call_pieces": [tok.token_text(i) for i in ids]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write tokenizer.json")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--transcripts", type=int, default=2000, help="rendered train transcripts in the sample")
    ap.add_argument("--stdlib-chars", type=int, default=4_000_000, help="stdlib characters in the sample")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    tokenizer = build_tokenizer(args.vocab_size, n_transcripts=args.transcripts, stdlib_chars=args.stdlib_chars,
                                seed=args.seed)
    stats = check_tokenizer(tokenizer)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out))
    print(f"wrote {args.out} in {time.time() - t0:.1f}s: {stats}")


if __name__ == "__main__":
    main()
