"""Fork a runtime session: copy its cache rows into fresh blocks (exact, no prefill).

The edit bench times one edit many times on the same cached history; forking
gives every repetition the exact original cache for the cost of a memcpy,
instead of an untimed re-prefill. Uses runtime internals (bench only).
"""

from __future__ import annotations

import uuid

from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.runtime import Runtime
from leyline_runtime.sessions.session import Session


def fork_session(runtime: Runtime, session_id: str, tenant: str) -> str:
    with runtime._lock:
        src = runtime._get(tenant, session_id)
        n = src.num_tokens
        table = BlockTable(runtime.pool.block_size)
        runtime.blocks.reserve(table, n)  # raises CapacityExceeded rather than evicting
        rows = runtime.pool.rows
        rows[:, table.rows(0, n, rows.device)] = rows[:, src.table.rows(0, n, rows.device)]
        fork_id = f"{session_id}-fork-{uuid.uuid4().hex[:8]}"
        runtime._sessions[(tenant, fork_id)] = Session(
            fork_id, tenant, table, list(src.messages), [list(t) for t in src.message_tokens],
            version=src.version)
        return fork_id
