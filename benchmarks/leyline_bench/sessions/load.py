"""The shipped mini-swe-agent sessions, read from the checkout: nothing is downloaded.

    from leyline_bench.sessions.load import load_sessions
    sessions = load_sessions()               # the held-out ones; split="calibration" for the others
    sessions[0].messages                     # list[leyline_sdk.protocol.Message]

The file and how it was made: ``benchmarks/data/mini_swe_agent/PROVENANCE.md``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from leyline_sdk.protocol import Message

from .split import SPLITS, Split

SESSIONS_FILE = Path(__file__).resolve().parents[2] / "data" / "mini_swe_agent" / "sessions.jsonl.gz"


@dataclass(frozen=True)
class Session:
    """One SWE-bench Verified session of Gemini 3 Pro driving mini-swe-agent, as a chat."""

    instance_id: str
    split: Split
    sha1: str
    source_path: str
    source_commit: str
    # What the provider counted for the last model call's prompt (None where not recorded).
    last_call_prompt_tokens: int | None
    messages: list[Message]


def load_sessions(split: Split = "heldout", path: Path = SESSIONS_FILE) -> list[Session]:
    """The sessions of one split, in the file's order (by the SHA-1 of the instance id)."""
    if split not in SPLITS:
        raise ValueError(f"split is one of {SPLITS}, not {split!r}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the sessions ship in the repository checkout, not in the wheel")
    sessions = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record["split"] != split:
                continue
            sessions.append(Session(
                instance_id=record["instance_id"], split=record["split"], sha1=record["sha1"],
                source_path=record["source_path"], source_commit=record["source_commit"],
                last_call_prompt_tokens=record["last_call_prompt_tokens"],
                messages=[Message.model_validate(m) for m in record["messages"]]))
    return sessions
