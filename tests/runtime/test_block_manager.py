"""The block manager owns every KV block: its operations, and the accounting of a real runtime.

After any mix of sessions, directive batches, generations, evictions and deletes, the free
count plus every session's blocks is the pool's size, no block is held twice, and each session
holds exactly the blocks its tokens need.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from leyline_sdk.errors import CapacityExceeded
from leyline_sdk.protocol import Directive, DirectiveBatch, GenerateRequest, Message, SessionCreate, Span
from leyline_runtime.engine.kv_cache import BlockTable
from leyline_runtime.runtime import Runtime, RuntimeConfig

from helpers import agent_history

RUNTIME = Path(__file__).resolve().parents[2] / "leyline_runtime"


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=4096, block_size=16))


def assert_accounted(rt: Runtime) -> None:
    held = [b for s in rt._sessions.values() for b in s.table.blocks]
    assert len(held) == len(set(held)), "a block is held twice"
    assert rt.blocks.num_free + len(held) == rt.blocks.num_blocks
    for s in rt._sessions.values():
        assert len(s.table.blocks) == rt.blocks.blocks_for(s.num_tokens), s.session_id


def test_reserve_trim_fork_commit_release(rt):
    blocks, free = rt.blocks, rt.blocks.num_free
    table = BlockTable(blocks.block_size)
    assert len(blocks.reserve(table, 33)) == 3 and blocks.reserve(table, 40) == []
    assert blocks.num_free == free - 3
    blocks.trim(table, 17)
    assert len(table.blocks) == 2 and blocks.num_free == free - 2
    forked, fresh = blocks.fork(table, 1, 48)
    assert forked.blocks[:1] == table.blocks[:1] and forked.blocks[1:] == fresh and len(fresh) == 2
    blocks.commit(table, forked)  # the shared first block stays, the old second one is given back
    assert blocks.num_free == free - 3
    blocks.release(forked)
    assert forked.blocks == [] and blocks.num_free == free


def test_reserve_takes_nothing_when_the_pool_is_short():
    small = Runtime(RuntimeConfig(max_cache_tokens=64, block_size=16))
    table = BlockTable(16)
    with pytest.raises(CapacityExceeded):
        small.blocks.reserve(table, 80)
    assert table.blocks == [] and small.blocks.num_free == 4


def test_accounting_through_sessions_directives_and_generations(rt):
    sids = [rt.create_session(SessionCreate(messages=agent_history(4 + 7 * i))).session_id for i in range(3)]
    assert_accounted(rt)
    for mode in ("amortize", "forget", "auto"):
        for sid in sids:
            rt.apply(DirectiveBatch(session_id=sid, directives=[
                Directive(span=Span(start=3, end=4), mode=mode,
                          replacement=[Message(role="tool", content=f"[{mode}]", tool_call_id="c1")])]))
            assert_accounted(rt)
    for sid in sids:
        rt.generate(sid, GenerateRequest(max_tokens=7, temperature=0.0,
                                         messages=[Message(role="user", content="And then?")]))
        assert_accounted(rt)
        rt.apply(DirectiveBatch(session_id=sid, directives=[Directive(span=Span(start=2, end=4))]))
        assert_accounted(rt)
    for sid in sids:
        rt.delete_session(sid)
    assert_accounted(rt)
    assert rt.blocks.num_free == rt.blocks.num_blocks


def test_eviction_gives_the_victims_blocks_back():
    small = Runtime(RuntimeConfig(max_cache_tokens=1024, block_size=16))
    for i in range(6):  # more than fit: the oldest are evicted
        small.create_session(SessionCreate(messages=agent_history(20), session_id=f"s{i}"))
        assert_accounted(small)
    assert small.stats.evictions > 0


def test_only_the_block_manager_takes_or_frees_blocks():
    """No other runtime module calls the pool's allocate/free: one owner for blocks."""
    callers = []
    for path in RUNTIME.rglob("*.py"):
        if path.name == "block_manager.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("allocate", "free") and "pool" in ast.unparse(node.func.value):
                callers.append(f"{path.relative_to(RUNTIME)}:{node.lineno}")
    assert callers == []


def test_a_failed_transaction_gives_back_every_block_it_took(rt):
    """The executor's transaction (which auto mode runs its decisions inside) takes blocks for the
    splice, and its caller takes more for recomputes; an error gives all of them back."""
    sid = rt.create_session(SessionCreate(messages=agent_history(12))).session_id
    session, free = rt._sessions[("default", sid)], rt.blocks.num_free
    table, version = list(session.table.blocks), session.version
    plan = rt.executor.plan(session, [Directive(span=Span(start=1, end=2), mode="amortize",
                                                replacement=[Message(role="user", content="What is api_port?")])])
    with pytest.raises(RuntimeError, match="inside"):
        with rt.executor.transaction(session, plan) as txn:
            txn.owned.extend(rt.blocks.take(2))  # as a recompute's copy-on-write does
            assert rt.blocks.num_free < free
            raise RuntimeError("failed inside the transaction")
    assert rt.blocks.num_free == free and session.table.blocks == table and session.version == version
    rt.delete_session(sid)
    assert_accounted(rt)
