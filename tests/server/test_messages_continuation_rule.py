"""The rule that finds the held session a request without a session id continues
(``leyline_runtime.api.continuation.ContinuationIndex``), on its own: torch-free, no server."""

from __future__ import annotations

from leyline_runtime.api.continuation import ContinuationIndex, Scope, history_keys
from leyline_sdk.protocol import Message

ALICE = Scope("tenant-a")


def msgs(*texts: str) -> list[Message]:
    return [Message(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(texts)]


def test_the_longest_held_history_the_request_starts_with_is_claimed():
    index = ContinuationIndex()
    index.record(ALICE, msgs("q1", "a1"), "short")
    index.record(ALICE, msgs("q1", "a1", "q2", "a2"), "long")
    claim = index.claim(ALICE, msgs("q1", "a1", "q2", "a2", "q3"))
    assert claim is not None and (claim.session_id, claim.matched) == ("long", 4)
    # the request's own history, not merely a common start: a branch off the held history misses
    assert index.claim(ALICE, msgs("q1", "a1", "q2", "other", "q3")).session_id == "short"
    assert index.claim(ALICE, msgs("q1", "other")) is None


def test_a_claim_takes_the_session_out_until_recorded_or_restored():
    index = ContinuationIndex()
    index.record(ALICE, msgs("q1", "a1"), "s")
    claim = index.claim(ALICE, msgs("q1", "a1", "q2"))
    assert claim is not None and index.claim(ALICE, msgs("q1", "a1", "q2")) is None  # a parallel request misses
    index.restore(claim)  # the turn failed: found by its old history again
    claim = index.claim(ALICE, msgs("q1", "a1", "q2"))
    assert claim is not None and claim.session_id == "s"
    index.record(ALICE, msgs("q1", "a1", "q2", "a2"), "s")  # the turn done: found by the new one only
    assert index.claim(ALICE, msgs("q1", "a1", "q3")) is None
    assert index.claim(ALICE, msgs("q1", "a1", "q2", "a2", "q3")).session_id == "s"
    assert len(index) == 0


def test_another_tenant_user_or_client_session_never_finds_the_session():
    index = ContinuationIndex()
    history = msgs("q1", "a1")
    index.record(Scope("tenant-a", "alice"), history, "s")
    request = [*history, *msgs("q2")]
    index.record(Scope("tenant-a", "alice", "cc-1"), history, "cc")
    for scope in (Scope("tenant-b", "alice"), Scope("tenant-a"), Scope("tenant-a", "bob"), Scope("tenant-b"),
                  Scope("tenant-a", "alice", "cc-2"), Scope("tenant-a", None, "cc-1")):
        assert index.claim(scope, request) is None, scope
    assert index.claim(Scope("tenant-a", "alice"), request).session_id == "s"
    assert index.claim(Scope("tenant-a", "alice", "cc-1"), request).session_id == "cc"


def test_the_key_is_what_renders_and_leyline_ids_are_not_part_of_it():
    plain = msgs("q1", "a1")
    with_ids = [m.model_copy(update={"id": f"m{i}"}) for i, m in enumerate(plain)]
    assert history_keys(ALICE, plain) == history_keys(ALICE, with_ids)
    assert history_keys(ALICE, plain) != history_keys(ALICE, msgs("q1", "a1 "))
    assert history_keys(ALICE, msgs("q1", "a1")) != history_keys(ALICE, msgs("q1a", "1"))  # chained per message


def test_the_least_recently_recorded_is_forgotten_past_capacity():
    index = ContinuationIndex(capacity=2)
    for name in ("s1", "s2", "s3"):
        index.record(ALICE, msgs(name), name)
    assert len(index) == 2 and index.claim(ALICE, msgs("s1", "a")) is None
    assert index.claim(ALICE, msgs("s3", "a")).session_id == "s3"


def test_continuing_records_the_reply_and_puts_a_failed_turns_session_back():
    index = ContinuationIndex()
    with index.continuing(ALICE, msgs("q1")) as first:  # a miss: a new session
        first.reply = msgs("", "a1")[1]
    assert first.session_id.startswith("continued_")
    try:
        with index.continuing(ALICE, msgs("q1", "a1", "q2")) as failed:
            assert failed.session_id == first.session_id
            raise RuntimeError("the turn failed")
    except RuntimeError:
        pass
    with index.continuing(ALICE, msgs("q1", "a1", "q2")) as second:  # found again, by its old history
        assert second.session_id == first.session_id
        second.reply = msgs("", "a2")[1]
    assert index.claim(ALICE, msgs("q1", "a1", "q2", "a2", "q3")).session_id == first.session_id
