"""Training corpus: Python standard-library source + synthetic agent transcripts.

* Stdlib: the running interpreter's ``.py`` sources (PSF licence), in sorted
  order, test folders and huge files skipped, cut at line boundaries into
  chunks of at most :data:`CHUNK_CHARS` characters, each prefixed with a
  ``# file: path`` line. Tokenised with ``ChatTokenizer.encode``.
* Transcripts: :func:`.transcripts.make_transcript` (train split), tokenised
  message by message exactly as the runtime does
  (``ChatTokenizer.encode_message``: role header + body + ``<|end|>``).

Every document ends with ``<|endoftext|>``. :class:`Packer` packs documents into
fixed-length rows: whole transcripts first (the first starts at position 0,
as a conversation does at inference), then stdlib text fills the rest of the
row (cut anywhere, continued in the next row). A running balance keeps the
mixture at ``transcript_share`` of the tokens. Rows come in *shards*, each a
pure function of ``(seed, shard index, seq_len)``, so a data position is
``(shard, row)`` and resuming regenerates one shard.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from leyline_sdk.protocol import Message

from leyline_runtime.text import chat_template as tpl
from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_runtime.text.tokenizer import ChatTokenizer
from .drills import ECHO_PROMPT, make_drill, make_script_drill
from .transcripts import TaskMix, make_transcript

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings",
             "pydoc_data", "lib2to3", "ensurepip", "turtledemo"}
MAX_FILE_BYTES = 300_000
CHUNK_CHARS = 12_000

# Per-token loss classes stored next to the ids.
CLS_TEXT = 0  # stdlib, separators
CLS_CONTEXT = 1  # system / user / tool messages, role headers
CLS_ASSISTANT = 2  # what the model generates: assistant bodies and their end marker
CLS_NOISE = 3  # random by construction (token-echo drills' user text): no loss

SEED_STRIDE = 10_000  # transcript seeds of shard k: k * SEED_STRIDE + j


# --------------------------------------------------------------------------- stdlib


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=2)
def stdlib_files(root: str | None = None) -> tuple[Path, ...]:
    """Sorted stdlib ``.py`` files, tests / vendored / data-table folders and huge files skipped."""
    base = Path(root) if root else stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            try:
                if path.stat().st_size > MAX_FILE_BYTES:
                    continue
            except OSError:
                continue
            out.append(path)
    return tuple(sorted(out, key=lambda p: p.relative_to(base).as_posix()))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


@functools.lru_cache(maxsize=2)
def stdlib_chunks(root: str | None = None) -> tuple[str, ...]:
    """The stdlib as documents of at most :data:`CHUNK_CHARS` characters."""
    base = Path(root) if root else stdlib_root()
    chunks = []
    for path in stdlib_files(root):
        text = _read(path)
        if not text or not text.strip():
            continue
        rel = path.relative_to(base).as_posix()
        lines = text.splitlines(keepends=True)
        cur, size, part = [], 0, 0
        for line in lines:
            if size + len(line) > CHUNK_CHARS and cur:
                chunks.append(f"# file: {rel} (part {part + 1})\n" + "".join(cur))
                cur, size, part = [], 0, part + 1
            cur.append(line[:CHUNK_CHARS])
            size += len(cur[-1])
        if cur:
            chunks.append(f"# file: {rel}" + (f" (part {part + 1})" if part else "") + "\n" + "".join(cur))
    return tuple(chunks)


# --------------------------------------------------------------------------- transcripts as text


def render_transcript(messages: list[Message]) -> str:
    return "".join(tpl.render_message(m) for m in messages)


def rendered_documents(n_transcripts: int, stdlib_chars: int, seed: int = 0) -> Iterator[str]:
    """Text documents (used to train the tokenizer): stdlib sample + rendered train transcripts."""
    rng = random.Random(f"tokenizer-sample:{seed}")
    chunks = list(stdlib_chunks())
    rng.shuffle(chunks)
    total = 0
    for chunk in chunks:
        if total >= stdlib_chars:
            break
        total += len(chunk)
        yield chunk
    for i in range(n_transcripts):
        yield render_transcript(make_transcript(1_000_000_000 + seed * 100_000 + i, "train").messages)


# --------------------------------------------------------------------------- tokenisation


def transcript_tokens(tok: ChatTokenizer, messages: list[Message],
                      random_user_text: bool = False) -> tuple[list[int], list[int]]:
    """Ids and loss classes; ids are exactly ``sum(tok.encode_messages(messages), [])``.

    ``random_user_text``: user bodies are random by construction (echo drills): no loss on them.
    """
    ids: list[int] = []
    cls: list[int] = []
    for m, message_ids in zip(messages, tok.encode_messages(messages)):
        ids.extend(message_ids)
        if m.role == "user" and random_user_text:  # header, body, end marker
            cls.extend([CLS_CONTEXT] + [CLS_NOISE] * (len(message_ids) - 2) + [CLS_CONTEXT])
        else:
            body_cls = CLS_ASSISTANT if m.role == "assistant" else CLS_CONTEXT
            cls.extend([CLS_CONTEXT] + [body_cls] * (len(message_ids) - 1))
    return ids, cls


def token_echo(tok: ChatTokenizer, seed: int, max_tokens: int) -> tuple[list[int], list[int]]:
    """Ids and loss classes of an echo drill over random token ids (see :mod:`.drills`).

    Rounds of 3-24 distinct ids, drawn from the tokenizer's ordinary tokens, until ``max_tokens``
    would be passed (at least one round).
    """
    rng = random.Random(f"token-echo:{seed}")
    ids, cls = transcript_tokens(tok, [Message(role="system", content=ECHO_PROMPT)])
    user, assistant, end = (tok.token_id(t) for t in (tpl.ROLE_TOKENS["user"], tpl.ROLE_TOKENS["assistant"], tpl.END))
    pool = ordinary_ids(tok)
    rounds = 0
    while True:
        run = rng.sample(pool, rng.randint(3, 24))
        if rounds and len(ids) + 2 * len(run) + 4 > max_tokens:
            return ids, cls
        ids += [user, *run, end, assistant, *run, end]
        cls += [CLS_CONTEXT, *[CLS_NOISE] * len(run), CLS_CONTEXT, CLS_CONTEXT, *[CLS_ASSISTANT] * (len(run) + 1)]
        rounds += 1


@functools.lru_cache(maxsize=2)
def ordinary_ids(tok: ChatTokenizer) -> tuple[int, ...]:
    """Ids that are neither special nor single bytes (whole pieces of text); once per tokenizer."""
    return tuple(i for i in range(256, tok.vocab_size) if i not in tok.control_ids)


# --------------------------------------------------------------------------- packing


@dataclass
class Shard:
    index: int
    seq_len: int
    tokens: np.ndarray  # [rows, seq_len + 1] int32
    classes: np.ndarray  # [rows, seq_len + 1] uint8
    transcript_tokens: int
    text_tokens: int
    transcripts: int
    skipped_long: int


@dataclass(frozen=True)
class DataMix:
    """What the packed rows are made of: the recipe flags of ``leyline-train train``, one field each.

    Every share is a probability (or a token fraction for ``transcript_share``);
    a zero share draws no die, so adding a kind left older recipes' data as it was.
    """
    transcript_share: float = 0.7  # of the tokens: transcripts (the rest: stdlib text)
    drill_share: float = 0.0  # of the conversations: copy/recall drills (.drills) instead of tasks
    token_echo_share: float = 0.0  # of the conversations: echo drills over random token ids
    wide_share: float = 0.0  # of the tasks and drills: the "wide" split's made-up entity names
    english_share: float = 0.0  # of the tasks and drills: the "english" split's real-word names
    order_share: float = 0.0  # the task kinds and prompt layouts: see transcripts.TaskMix
    api_share: float = 0.0
    custom_tool_share: float = 0.0
    script_share: float = 0.0  # of the conversations: copy drills in other writing systems (.writing_systems)

    @property
    def tasks(self) -> TaskMix:
        return TaskMix(self.order_share, self.api_share, self.custom_tool_share)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> DataMix:
        """The mix named by parsed ``train`` flags (their dests are the field names)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


class Packer:
    """Deterministic shards of packed rows (``seq_len + 1`` tokens: inputs + shifted targets)."""

    def __init__(self, tok: ChatTokenizer, mix: DataMix = DataMix(), *, seed: int = 0, rows_per_shard: int = 64,
                 split: str = "train"):
        self.tok = tok
        self.mix = mix
        self.seed = seed
        self.rows_per_shard = rows_per_shard
        self.split = split
        self.eot = tok.token_id(tpl.END_OF_TEXT)

    def _split(self, pick: random.Random) -> str:
        """The split of a task or drill. One die for both name pools, drawn last and only when one
        is asked for, so a recipe without them gets the same data as before."""
        mix = self.mix
        if not (mix.wide_share or mix.english_share):
            return self.split
        roll = pick.random()
        if roll < mix.wide_share:
            return "wide"
        return "english" if roll < mix.wide_share + mix.english_share else self.split

    def shard(self, index: int, seq_len: int) -> Shard:
        width = seq_len + 1
        rng = random.Random(f"shard:{self.seed}:{index}:{seq_len}")
        chunks = stdlib_chunks()
        tok, mix = self.tok, self.mix
        rows = np.full((self.rows_per_shard, width), self.eot, dtype=np.int32)
        classes = np.zeros((self.rows_per_shard, width), dtype=np.uint8)
        t_total = n_total = 0
        n_transcripts = skipped = 0
        j = 0
        pending: tuple[list[int], list[int]] | None = None
        text_buf: list[int] = []

        def next_transcript():
            nonlocal j, skipped
            while True:
                seed = self.seed * 1_000_000_000 + index * SEED_STRIDE + j
                j += 1
                pick = random.Random(f"pick:{seed}")
                drill = mix.drill_share and pick.random() < mix.drill_share
                if mix.token_echo_share and pick.random() < mix.token_echo_share:
                    ids, cls = token_echo(tok, seed, min(width - 1, 256))
                elif mix.script_share and pick.random() < mix.script_share:
                    messages, echo = make_script_drill(seed, self.split)
                    ids, cls = transcript_tokens(tok, messages, random_user_text=echo)
                else:
                    split = self._split(pick)
                    messages = (make_drill(seed, split) if drill
                                else make_transcript(seed, split, mix=mix.tasks).messages)
                    ids, cls = transcript_tokens(tok, messages)
                ids, cls = ids + [self.eot], cls + [CLS_CONTEXT]
                if len(ids) <= width:
                    return ids, cls
                skipped += 1

        for r in range(self.rows_per_shard):
            used = 0
            while True:
                if pending is None:
                    pending = next_transcript()
                ids, cls = pending
                behind = t_total + used < mix.transcript_share * (n_total + width)
                if not behind or used + len(ids) > width:
                    break
                rows[r, used:used + len(ids)] = ids
                classes[r, used:used + len(ids)] = cls
                used += len(ids)
                t_total += len(ids)
                n_transcripts += 1
                pending = None
            # fill the rest with stdlib text (class CLS_TEXT), continued across rows
            while used < width:
                if not text_buf:
                    text_buf = tok.encode(rng.choice(chunks)) + [self.eot]
                take = min(width - used, len(text_buf))
                rows[r, used:used + take] = text_buf[:take]
                text_buf = text_buf[take:]
                used += take
            n_total += width
        return Shard(index=index, seq_len=seq_len, tokens=rows, classes=classes, transcript_tokens=t_total,
                     text_tokens=n_total - t_total, transcripts=n_transcripts, skipped_long=skipped)


def loss_weights(classes: np.ndarray, assistant_weight: float = 2.0, text_weight: float = 1.0,
                 context_weight: float = 1.0) -> np.ndarray:
    """Per-target weights for rows' targets (``classes[:, 1:]``); noise tokens weigh nothing."""
    table = np.array([text_weight, context_weight, assistant_weight, 0.0], dtype=np.float32)
    return table[classes[:, 1:]]


# --------------------------------------------------------------------------- stats CLI


def corpus_stats(tok: ChatTokenizer, n_transcripts: int, split: str = "train", stdlib: bool = True) -> dict:
    """Token counts of ``n_transcripts`` transcripts (and of the whole stdlib)."""
    import collections

    lengths, assistant, by_kind = [], 0, collections.Counter()
    rounds = collections.Counter()
    for seed in range(n_transcripts):
        tr = make_transcript(seed, split)
        ids, cls = transcript_tokens(tok, tr.messages)
        lengths.append(len(ids))
        assistant += sum(1 for c in cls if c == CLS_ASSISTANT)
        by_kind[tr.task.kind] += len(ids)
        rounds[tr.tool_rounds] += 1
    arr = np.array(lengths)
    out = {
        "split": split, "transcripts": n_transcripts, "transcript_tokens": int(arr.sum()),
        "assistant_tokens": assistant, "mean": float(arr.mean()), "p50": int(np.percentile(arr, 50)),
        "p90": int(np.percentile(arr, 90)), "p99": int(np.percentile(arr, 99)), "max": int(arr.max()),
        "over_2049": int((arr + 1 > 2049).sum()), "over_513": int((arr + 1 > 513).sum()),
        "tool_rounds": dict(sorted(rounds.items())), "tokens_by_kind": dict(by_kind.most_common()),
    }
    if stdlib:
        chunks = stdlib_chunks()
        encs = tok.tokenizer.encode_batch(list(chunks), add_special_tokens=False)
        chars = sum(len(c) for c in chunks)
        toks = sum(len(e.ids) for e in encs)
        out.update(stdlib_files=len(stdlib_files()), stdlib_chunks=len(chunks), stdlib_chars=chars,
                   stdlib_tokens=toks, stdlib_chars_per_token=round(chars / toks, 3))
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Token counts of the training corpus.")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_MODEL_DIR / "tokenizer.json")
    ap.add_argument("--transcripts", type=int, default=2000)
    ap.add_argument("--split", default="train", choices=["train", "test"])
    ap.add_argument("--no-stdlib", action="store_true")
    args = ap.parse_args(argv)
    tok = ChatTokenizer.from_file(args.tokenizer)
    print(json.dumps(corpus_stats(tok, args.transcripts, args.split, not args.no_stdlib), indent=1))


if __name__ == "__main__":
    main()
