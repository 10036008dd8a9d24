"""Sessions are a cache; with ``--state-dir`` their histories survive a restart.

The KV cache lives in memory only: a restart (or an eviction) loses it.
With a state directory the service writes every session's message history
and version to ``<dir>/sessions.json`` when it shuts down (SIGTERM, SIGINT)
and prefills them again when it starts, least recently used first, so a
restart costs a re-prefill, not the history. The file is written to a
temporary name and renamed, so a crash while saving leaves the previous one.
A hard kill (SIGKILL, power loss) saves nothing: clients that must not lose
history keep it themselves (the OpenAI-style chat endpoint rebuilds a
missing session from the history it carries).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from leyline_sdk.errors import LeylineError
from leyline_sdk.protocol import Message

from ..runtime import Runtime

log = logging.getLogger("leyline.server")

STATE_FILE = "sessions.json"
FORMAT = 1


def save_sessions(runtime: Runtime, state_dir: str | Path) -> int:
    """Write every live session's history; returns how many."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    for tenant, sid in runtime.session_keys():
        try:
            messages, version = runtime.session_messages(sid, tenant)
        except LeylineError:
            continue  # deleted meanwhile
        saved.append({"tenant": tenant, "session_id": sid, "version": version,
                      "messages": [m.model_dump(mode="json", exclude_none=True) for m in messages]})
    tmp = folder / f".{STATE_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "sessions": saved}, f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)
    return len(saved)


def restore_sessions(runtime: Runtime, state_dir: str | Path) -> tuple[int, int]:
    """Prefill the saved sessions again; returns (restored, skipped)."""
    path = Path(state_dir) / STATE_FILE
    if not path.exists():
        return 0, 0
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        entries = saved["sessions"] if saved.get("format") == FORMAT else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("cannot read %s (%s); starting with no sessions", path, exc)
        return 0, 0
    restored = skipped = 0
    for entry in entries:
        try:
            messages = [Message.model_validate(m) for m in entry["messages"]]
            runtime.restore_session(entry["session_id"], messages, int(entry["version"]), entry["tenant"])
            restored += 1
        except (LeylineError, ValueError, KeyError, TypeError) as exc:
            skipped += 1
            log.warning("session %r not restored: %s", entry.get("session_id"), exc)
    return restored, skipped
