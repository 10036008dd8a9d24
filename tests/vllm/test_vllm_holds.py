"""The hold table's policy on vLLM's own BlockPool (no server): what a hold keeps out of the pool,
and which holds TTL, pressure, the budget and drops release, in which order."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm` (builds .venv-vllm)")

from vllm.v1.core.block_pool import BlockPool  # noqa: E402

from leyline_vllm.kv.holds import HoldTable  # noqa: E402

POOL = 33  # block 0 is vLLM's null block: 32 usable


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished_request(pool: BlockPool, table: HoldTable, key: str, n: int, block: int = 16):
    """A request that ran on ``n`` fresh blocks and finished: the table holds them, then vLLM frees the
    request's own references (as the scheduler does after request_finished)."""
    blocks = pool.get_new_blocks(n)
    table.hold(key, blocks, n * block)
    pool.free_blocks(reversed(blocks))
    return blocks


@pytest.fixture
def pool():
    return BlockPool(num_gpu_blocks=POOL, enable_caching=True, hash_block_size=16)


def table_on(pool, clock=None, **kw) -> HoldTable:
    kw = {"ttl_s": 60.0, "max_fraction": 1.0, **kw}
    return HoldTable(pool, clock=clock or Clock(), **kw)


def test_a_hold_keeps_its_blocks_out_of_the_pool_until_released(pool):
    table = table_on(pool)
    blocks = finished_request(pool, table, "a", 4)
    assert pool.get_num_free_blocks() == POOL - 1 - 4
    assert all(b.ref_cnt == 1 for b in blocks) and table.held_blocks == 4
    assert table.get("a").block_ids == [b.block_id for b in blocks]
    assert table.release("a", "dropped")
    assert pool.get_num_free_blocks() == POOL - 1 and table.held_blocks == 0
    assert table.get("a") is None and table.why_released("a") == "dropped"
    assert table.take_released() == ["a"] and table.releases["dropped"] == 1
    assert not table.release("a", "dropped")  # a second release is a no-op


def test_ttl_releases_idle_holds_only(pool):
    clock = Clock()
    table = table_on(pool, clock, ttl_s=10.0)
    finished_request(pool, table, "old", 2)
    clock.now += 6
    finished_request(pool, table, "new", 2)
    clock.now += 6  # old idle 12 s, new 6 s
    table.expire()
    assert table.get("old") is None and table.why_released("old") == "ttl"
    assert table.get("new") is not None
    clock.now += 9  # get() above marked "new" used: 9 s idle
    table.expire()
    assert table.get("new") is not None


def test_pressure_releases_the_least_recently_used_first_and_only_as_many_as_needed(pool):
    clock = Clock()
    table = table_on(pool, clock)
    for key in "abcd":
        finished_request(pool, table, key, 7)  # 28 of 32 held
        clock.now += 1
    table.get("a")  # a is used again: b is now the oldest
    assert pool.get_num_free_blocks() == 4
    table.relieve(10)  # needs 6 more: b (7) is enough
    assert [k for k in "abcd" if table.get(k) is None] == ["b"]
    assert table.why_released("b") == "pressure" and pool.get_num_free_blocks() == 11
    table.relieve(100)  # more than exists: everything unpinned goes
    assert len(table) == 0 and pool.get_num_free_blocks() == POOL - 1


def test_a_pinned_hold_survives_pressure_and_ttl(pool):
    clock = Clock()
    table = table_on(pool, clock, ttl_s=1.0)
    finished_request(pool, table, "source", 8)
    table.pin("source")
    clock.now += 5
    table.expire()
    table.relieve(POOL)
    assert table.get("source") is not None
    table.unpin("source")
    table.expire()  # get() refreshed it: still fresh
    clock.now += 5
    table.expire()
    assert table.get("source") is None and table.why_released("source") == "ttl"


def test_the_budget_caps_the_held_share_of_the_pool(pool):
    table = table_on(pool, max_fraction=0.5)  # 16 of 33
    finished_request(pool, table, "a", 8)
    finished_request(pool, table, "b", 8)
    assert table.held_blocks == 16
    finished_request(pool, table, "c", 4)  # over: the oldest goes
    assert table.get("a") is None and table.why_released("a") == "budget" and table.held_blocks == 12


def test_with_a_host_tier_a_released_hold_keeps_its_blocks_until_the_worker_copied_them(pool):
    table = table_on(pool, spill=True)
    finished_request(pool, table, "a", 5)
    table.release("a", "ttl")
    assert table.spilling("a") and table.held_blocks == 5 and pool.get_num_free_blocks() == POOL - 1 - 5
    (spill,) = table.take_spills()
    assert spill.key == "a" and len(spill.block_ids) == 5 and spill.tokens == 80
    table.spilled(["a"])
    assert not table.spilling("a") and table.held_blocks == 0 and pool.get_num_free_blocks() == POOL - 1
    # a drop never copies: the session is done with the rows
    finished_request(pool, table, "b", 2)
    table.release("b", "dropped")
    assert not table.take_spills() and pool.get_num_free_blocks() == POOL - 1


def test_held_blocks_stay_in_the_prefix_cache_after_release(pool):
    """A released hold's full blocks go back as evictable cached blocks, as a finished request's do."""
    table = table_on(pool)
    blocks = finished_request(pool, table, "a", 3)
    table.release("a", "dropped")
    assert all(b.ref_cnt == 0 for b in blocks)
    assert pool.get_num_free_blocks() == POOL - 1
