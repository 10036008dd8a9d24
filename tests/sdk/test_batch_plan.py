"""One batch planner: the SDK and the session-bound chat turn send the same batches.

The same recorded edit sequences (tests/batch_sequences.py: retries, dropped
tool outputs, truncations, summaries, appends, id-only edits, histories edited
past MAX_DIRECTIVES) go through

* ``LeylineMemory.sync`` — the SDK's whole synchronisation flow, against an
  in-memory session store that answers its calls as the runtime does;
* ``leyline_runtime.api.chat_turn.plan_chat_turn`` — what a session-bound
  ``/v1/chat/completions`` turn sends, on both engines (the bundled runtime's
  ``ChatService`` and the vLLM plugin's ``LeylineService.chat`` run its plan);

and every step must produce the identical batch (or the identical "rebuild").
"""

from __future__ import annotations

import pytest
from batch_sequences import recorded_sequences

from leyline_runtime.api.chat_turn import plan_chat_turn
from leyline_sdk import LeylineMemory
from leyline_sdk.batch_plan import plan_batch
from leyline_sdk.diff import apply_directives, split_append
from leyline_sdk.errors import InvalidDirective, SessionNotFound
from leyline_sdk.policy import force_mode
from leyline_sdk.protocol import (
    MAX_DIRECTIVES,
    AppendResult,
    Directive,
    DirectiveOutcome,
    DirectiveResult,
    Message,
    SessionCounters,
    SessionInfo,
    Usage,
)

SEQUENCES = recorded_sequences()
Batch = tuple | str


def _batch(directives: list[Directive]) -> Batch:
    return tuple((d.span.start, d.span.end, d.mode, tuple((m.id, m.fingerprint()) for m in d.replacement))
                 for d in directives)


class _SessionStore:
    """Answers LeylineMemory's client calls as a runtime would (one session, messages only)."""

    def __init__(self) -> None:
        self.messages: list[Message] | None = None
        self.version = 0
        self.events: list[Batch] = []
        self.refused = 0

    def _info(self, include_messages: bool = False) -> SessionInfo:
        assert self.messages is not None
        return SessionInfo(session_id="s", version=self.version, num_tokens=len(self.messages),
                           num_messages=len(self.messages), segments=[], counters=SessionCounters(),
                           messages=list(self.messages) if include_messages else None)

    def get_session(self, sid: str, include_messages: bool = False) -> SessionInfo:
        if self.messages is None:
            raise SessionNotFound(f"no session {sid}")
        return self._info(include_messages)

    def create_session(self, messages: list[Message], session_id: str, rebuild_reason: str | None = None) -> SessionInfo:
        self.messages, self.version = list(messages), self.version + 1
        self.events.append("build")
        return self._info()

    def delete_session(self, sid: str) -> None:
        self.messages = None

    def apply(self, sid: str, directives: list[Directive], expected_version: int | None = None) -> DirectiveResult:
        assert self.messages is not None and expected_version == self.version
        if len(directives) > MAX_DIRECTIVES:  # as DirectiveBatch refuses it (a 422)
            self.refused += 1
            raise InvalidDirective(f"{len(directives)} directives; the limit is {MAX_DIRECTIVES}")
        self.messages, self.version = apply_directives(self.messages, directives), self.version + 1
        self.events.append(_batch(directives))
        return DirectiveResult(session_id=sid, version=self.version, num_tokens=len(self.messages),
                               num_messages=len(self.messages), elapsed_ms=0.0, outcomes=[
                                   DirectiveOutcome(requested_mode=d.mode, applied_mode="forget", token_start=0,
                                                    token_end=0, delta=0) for d in directives])

    def append(self, sid: str, messages: list[Message], expected_version: int | None = None) -> AppendResult:
        assert self.messages is not None and expected_version == self.version
        self.messages, self.version = self.messages + list(messages), self.version + 1
        n = len(self.messages)
        return AppendResult(session_id=sid, version=self.version, num_tokens=n, num_messages=n,
                            usage=Usage(prompt_tokens=n, cached_tokens=n, prefill_tokens=0))


def sdk_batches(histories: list[list[Message]], mode: str) -> list[Batch]:
    """Each step's batch as LeylineMemory.sync sends it ("build" when it builds the session)."""
    store = _SessionStore()
    memory = LeylineMemory(store, policy=force_mode(mode))  # type: ignore[arg-type]
    out: list[Batch] = []
    for view in histories:
        store.events.clear()
        memory.sync("t", view)
        assert store.messages is not None
        assert [m.fingerprint() for m in store.messages] == [m.fingerprint() for m in view]
        out.append(store.events[-1] if store.events else ())
    assert store.refused == 0, "the planner sent a batch over the limit"
    return out


def chat_batches(histories: list[list[Message]], mode: str) -> list[Batch]:
    """Each step's batch as a session-bound chat turn sends it; the session then holds what the turn made of it."""
    session: list[Message] | None = None
    out: list[Batch] = []
    for messages in histories:
        plan = plan_chat_turn(session, messages, mode)
        if plan.build:
            assert plan.built == (session is None)
            assert session is None or plan.rebuild_reason == "too_many_edits"
            session, batch = list(messages), "build"
        else:
            # the turn relabels the id-only edits (batch.local), applies the batch and appends the tail
            session = apply_directives(session, [*plan.directives, *plan.batch.local]) + plan.appended
            batch = _batch(plan.directives)
        out.append(batch)
    return out


@pytest.mark.parametrize("mode", ["amortize", "forget"])
def test_the_sdk_and_the_chat_turn_plan_identical_batches(mode):
    assert len(SEQUENCES) >= 50
    for name, kinds, histories in SEQUENCES:
        assert sdk_batches(histories, mode) == chat_batches(histories, mode), f"{name} ({kinds}) planned differently"


def test_the_sequences_cover_every_kind_of_edit():
    kinds = {k for _, ks, _ in SEQUENCES for k in ks}
    assert kinds >= {"append", "retry", "drop_tool_outputs", "truncate", "summarise", "rename", "rewrite_all"}
    plans = [plan_batch(h[i - 1], h[i]) for _, _, h in SEQUENCES for i in range(1, len(h))]
    assert any(p.rebuild for p in plans)
    assert any(p.local for p in plans)  # id-only edits, not sent
    assert any(len(split_append(h[i - 1], h[i])[0]) > len(plan_batch(h[i - 1], h[i]).directives)
               for _, _, h in SEQUENCES for i in range(1, len(h)))  # tool units merged


def test_above_the_limit_the_plan_is_a_rebuild():
    _, _, histories = next(s for s in SEQUENCES if s[0] == "over_limit0")
    plan = plan_batch(histories[0], histories[1])
    assert plan.rebuild and not plan.directives and not plan.tail
    assert not plan_batch(histories[0], histories[1], max_directives=10**6).rebuild


def test_id_only_edits_are_local_and_tool_units_merge():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    old = [Message(role="user", content="q", id="u"),
           Message(role="assistant", content="", tool_calls=[call], id="a"),
           Message(role="tool", content="long output", tool_call_id="c1", id="t")]
    cleared_call = {**call, "function": {"name": "f", "arguments": "{}"}}
    new = [old[0].model_copy(update={"id": "u2"}),
           Message(role="assistant", content="", tool_calls=[cleared_call], id="a"),
           old[2].model_copy(update={"content": "[cleared]"})]
    plan = plan_batch(old, new)
    assert [(d.span.start, d.span.end) for d in plan.local] == [(0, 1)]
    assert [(d.span.start, d.span.end) for d in plan.directives] == [(1, 3)]
    assert plan.tail == []
