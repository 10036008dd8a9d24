"""Edits measured one by one, each written down as it finishes, so a run cut short resumes where it stopped.

A journal is a JSON-lines file: one line per finished edit of one arm (``label``: a model, or a model's
peer), keyed by the edit's place in the selection and its session and kind — a journal written under other
settings does not match and is not reused. ``None`` records (an edit that could not be measured) are kept
too, so they are not tried again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path


class Journal:
    def __init__(self, path: str | Path, label: str):
        self.path, self.label, self.done = Path(path), label, {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                entry = json.loads(line)
                if entry["model"] == label:
                    self.done[(entry["index"], entry["session"], entry["kind"])] = entry["record"]

    @staticmethod
    def key(index: int, edit) -> tuple:
        return index, edit.history.session, edit.kind

    def add(self, index: int, edit, record: dict | None) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"model": self.label, "index": index, "session": edit.history.session,
                                "kind": edit.kind, "record": record}) + "\n")


def each_edit(edits: list, measure: Callable[[object], dict | None], journal: Journal | None,
              describe: Callable[[int, object, dict], str], log=print) -> list[dict]:
    """``measure(edit)`` for every edit the journal does not hold yet (its time in the record's
    ``seconds``); the records of all of them, in order, without the unmeasurable ones."""
    out = []
    for index, edit in enumerate(edits):
        if journal and journal.key(index, edit) in journal.done:
            if (record := journal.done[journal.key(index, edit)]) is not None:
                out.append(record)
            continue
        t0 = time.perf_counter()
        record = measure(edit)
        if record is not None:
            record["seconds"] = time.perf_counter() - t0
        if journal:
            journal.add(index, edit, record)
        if record is None:
            log(f"{edit.kind} {edit.history.session}: skipped (the render is not appendable)")
            continue
        out.append(record)
        log(f"{len(out)}/{len(edits)} {edit.kind} {edit.history.session} " + describe(len(out), edit, record))
    return out
