"""``Inspector``: what the benches read and try on a runtime's sessions, through the runtime's own
locks and block manager (``tests/repo/test_runtime_privacy.py`` keeps them from doing it themselves)."""

import pytest
import torch
from helpers import agent_history, fp32_diff
from server_support import torch_threads

from leyline_runtime.inspection import Inspector
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_sdk.errors import SessionExists
from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate, Span

T = "t"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=4096))


@pytest.fixture
def inspect(rt):
    inspector = Inspector(rt)
    free = inspector.free_blocks
    yield inspector
    for info in rt.list_sessions(T):
        rt.delete_session(info.session_id, T)
    assert inspector.free_blocks == free  # every block it took went back


def new_session(rt, messages=None) -> str:
    return rt.create_session(SessionCreate(messages=messages or agent_history()), T).session_id


def state(rt, inspect, sid) -> tuple:
    return (rt.get_session(sid, T).version, inspect.tokens(sid, T), inspect.block_ids(sid, T),
            inspect.free_blocks, inspect.cache_rows(sid, T))


def assert_same_state(a: tuple, b: tuple) -> None:
    assert a[:4] == b[:4] and torch.equal(a[4], b[4])


def test_probes_leave_the_session_as_it_was(rt, inspect):
    sid = new_session(rt)
    before = state(rt, inspect, sid)
    logits = inspect.next_token_logits(sid, T)
    greedy = inspect.greedy_continuation(sid, 4, T)
    assert_same_state(state(rt, inspect, sid), before)
    assert logits.shape == (rt.model.config.vocab_size,) and len(greedy) == 4
    assert greedy[0] == int(logits.argmax())
    assert torch.equal(inspect.next_token_logits(sid, T), logits)


def test_append_scored_appends_and_scores_every_position(rt, inspect):
    scored, plain = new_session(rt), new_session(rt)
    cached, bs = len(inspect.tokens(scored, T)), rt.config.block_size

    def added(turn: list[Message]) -> int:
        return sum(map(len, rt.tokenizer.encode_messages(turn)))

    # a turn that ends on a block boundary: the assistant header's row needs a block of its own
    turns = ([Message(role="user", content="db_port? " * k)] for k in range(4 * bs))
    turn = next(t for t in turns if (cached + added(t)) % bs == 0)
    logits = inspect.append_scored(scored, turn, T)
    rt.append(plain, turn, T)
    assert logits.shape == (added(turn) + 1, rt.model.config.vocab_size)  # + the assistant header's
    assert inspect.tokens(scored, T) == inspect.tokens(plain, T)
    assert rt.get_session(scored, T).version == rt.get_session(plain, T).version
    assert len(inspect.block_ids(scored, T)) == len(inspect.tokens(scored, T)) // bs  # the header's row is not kept
    assert fp32_diff(logits[-1], inspect.next_token_logits(plain, T)) <= 1e-4
    assert inspect.append_scored(scored, [], T).shape == (1, rt.model.config.vocab_size)


def test_fork_gets_the_drift_record_and_a_fresh_id(rt, inspect):
    sid = new_session(rt)
    rt.apply(DirectiveBatch(session_id=sid, directives=[Directive(span=Span(start=2, end=4))]), T)
    fork = inspect.fork(sid, T, fork_id="copy")
    assert fork == "copy" and rt.get_session(fork, T).drift == rt.get_session(sid, T).drift
    with pytest.raises(SessionExists):
        inspect.fork(sid, T, fork_id="copy")


def test_recompute_makes_the_rows_exact_and_moves_the_drift_record(rt, inspect):
    """An amortize leaves rows after its edit stale; recomputing from the earliest drifted position
    to ``end`` makes those rows a fresh prefill's, and the drift record starts at ``end``."""
    sid = new_session(rt)
    rt.apply(DirectiveBatch(session_id=sid, directives=[Directive(span=Span(start=2, end=4))]), T)
    info = rt.get_session(sid, T)
    start, n = info.drift.earliest_position, info.num_tokens
    end = start + (n - start) // 2
    messages, _ = rt.session_messages(sid, T)
    fresh = inspect.cache_rows(new_session(rt, messages), T)
    assert fp32_diff(inspect.cache_rows(sid, T)[:, start:end], fresh[:, start:end]) > 1e-3  # stale rows

    assert inspect.recompute(sid, start, end, T) == end - start
    after = rt.get_session(sid, T)
    assert after.drift.earliest_position == end and after.version == info.version
    assert after.counters.recomputed_tokens == info.counters.recomputed_tokens + end - start
    rows = inspect.cache_rows(sid, T)
    assert fp32_diff(rows[:, :end], fresh[:, :end]) <= 1e-4
    assert inspect.recompute(sid, 0, start, T) == start  # before the drift: the record stays
    assert rt.get_session(sid, T).drift.earliest_position == end
    assert inspect.recompute(sid, end, n, T) == n - end  # to the end: the session is exact again
    assert rt.get_session(sid, T).drift.earliest_position is None


def test_first_change_names_where_a_batch_begins(rt, inspect):
    sid = new_session(rt)
    offsets = [s.start for s in rt.get_session(sid, T).segments]
    before = state(rt, inspect, sid)
    assert inspect.first_change(sid, [Directive(span=Span(start=2, end=4))], T) == offsets[2]
    assert_same_state(state(rt, inspect, sid), before)


def test_scratch_work_takes_blocks_only_while_it_runs(rt, inspect):
    sid = new_session(rt)
    before = state(rt, inspect, sid)
    ids = inspect.tokens(sid, T)
    with inspect.scratch_prefill(ids) as prefill:
        assert inspect.free_blocks == before[3] - len(before[2])
        logits = prefill()
    with torch.no_grad():
        assert fp32_diff(logits, rt.model(torch.tensor([ids]))[0, -1]) <= 1e-4  # the last token's
    n = len(ids)
    with inspect.scratch_row_copy(sid, n - 40, n, T) as copy:
        assert inspect.free_blocks == before[3] - -(-40 // rt.config.block_size)
        copy()
    assert_same_state(state(rt, inspect, sid), before)
