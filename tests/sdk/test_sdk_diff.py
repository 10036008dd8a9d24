"""Message-list diff: apply(old, edits) + tail == new, and the edits form a valid batch."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leyline_sdk import (
    Directive,
    DirectiveBatch,
    EditContext,
    InvalidDirective,
    InvalidSpan,
    Message,
    Mode,
    OverlappingSpans,
    Span,
    apply_directives,
    default_policy,
    diff_messages,
    edit_intent,
    explain_edit,
    force_mode,
    split_append,
)
from leyline_sdk import _alignment as alignment_module
from leyline_sdk._alignment import align as _align
from leyline_sdk.protocol import FunctionCall, ToolCall

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = ["ok", "hello", "ls -la", "error: boom", "done", ""]  # few words: duplicates are common


def user(content: str, id: str | None = None) -> Message:
    return Message(role="user", content=content, id=id)


def assistant(content: str, id: str | None = None, calls: list[str] | None = None) -> Message:
    tool_calls = [ToolCall(id=c, function=FunctionCall(name="sh")) for c in calls or []]
    return Message(role="assistant", content=content, id=id, tool_calls=tool_calls or None)


def tool(content: str, call: str, id: str | None = None) -> Message:
    return Message(role="tool", content=content, tool_call_id=call, id=id)


# --- strategies -------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, max_turns: int = 8) -> list[Message]:
    """System?, then turns: user, assistant answers or tool calls with their results."""
    ids = itertools.count()
    id_style = draw(st.sampled_from(["none", "all", "mixed"]))

    def next_id() -> str | None:
        if id_style == "none" or (id_style == "mixed" and draw(st.booleans())):
            return None
        return f"m{next(ids)}"

    words = st.sampled_from(WORDS)
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message(role="system", content=draw(words), id=next_id()))
    for _ in range(draw(st.integers(0, max_turns))):
        kind = draw(st.sampled_from(["user", "answer", "tools"]))
        if kind == "user":
            messages.append(user(draw(words), next_id()))
        elif kind == "answer":
            messages.append(assistant(draw(words), next_id()))
        else:
            calls = [f"call{next(ids)}" for _ in range(draw(st.integers(1, 2)))]
            messages.append(assistant(draw(words), next_id(), calls))
            messages.extend(tool(draw(words), c, next_id()) for c in calls)
    return messages


def random_message(data: st.DataObject) -> Message:
    word = data.draw(st.sampled_from(WORDS))
    kind = data.draw(st.sampled_from(["user", "assistant", "tool", "new_id"]))
    if kind == "user":
        return user(word)
    if kind == "assistant":
        return assistant(word)
    if kind == "tool":
        return tool(word, "call-x")
    return user(word, id=f"fresh{data.draw(st.integers(0, 3))}")


def mutate(history: list[Message], data: st.DataObject) -> list[Message]:
    """One random edit of the kinds agents make."""
    new = list(history)
    kind = data.draw(
        st.sampled_from(
            [
                "delete",
                "insert",
                "rewrite",
                "truncate_tool",
                "append",
                "drop_attempt",
                "drop_id",
                "swap",
            ]
        )
    )
    index = data.draw(st.integers(0, max(len(new) - 1, 0)))
    if kind == "insert" or not new:
        new.insert(data.draw(st.integers(0, len(new))), random_message(data))
    elif kind == "append":
        new.extend(random_message(data) for _ in range(data.draw(st.integers(1, 3))))
    elif kind == "delete":
        del new[index]
    elif kind == "rewrite":
        new[index] = new[index].model_copy(
            update={"content": data.draw(st.sampled_from(WORDS)) + "!"}
        )
    elif kind == "truncate_tool":
        tools = [i for i, m in enumerate(new) if m.role == "tool"]
        if tools:
            i = data.draw(st.sampled_from(tools))
            new[i] = new[i].model_copy(update={"content": new[i].content[:2] + "[cleared]"})
    elif kind == "drop_attempt":
        new = _drop_tool_attempt(new, data)
    elif kind == "drop_id":
        new[index] = new[index].model_copy(update={"id": None})
    else:
        other = data.draw(st.integers(0, len(new) - 1))
        new[index], new[other] = new[other], new[index]
    return new


def _drop_tool_attempt(messages: list[Message], data: st.DataObject) -> list[Message]:
    attempts = [i for i, m in enumerate(messages) if m.tool_calls]
    if not attempts:
        return messages
    i = data.draw(st.sampled_from(attempts))
    calls = {c.id for c in messages[i].tool_calls or []}
    return [m for k, m in enumerate(messages) if k != i and m.tool_call_id not in calls]


def assert_valid_batch(edits: list[Directive], n_old: int) -> None:
    starts = [(d.span.start, d.span.end > d.span.start) for d in edits]
    assert starts == sorted(starts)
    for a, b in itertools.combinations(edits, 2):
        assert not a.span.overlaps(b.span)
    for d in edits:
        assert d.span.unit == "message" and d.span.end <= n_old
        assert d.span.start < d.span.end or d.replacement  # no empty no-op directive
    for ins in (d for d in edits if d.span.start == d.span.end):
        # an insertion touching another span is folded into it: no order left to convention
        assert all(ins.span.start not in (o.span.start, o.span.end) for o in edits if o is not ins)
    if edits:
        DirectiveBatch(session_id="s", directives=edits)


def lcs_length(old: list[Message], new: list[Message]) -> int:
    def same(a: Message, b: Message) -> bool:
        if a.id is not None and b.id is not None:
            return a.id == b.id
        return a.fingerprint() == b.fingerprint()

    prev = [0] * (len(new) + 1)
    for a in old:
        row = [0] * (len(new) + 1)
        for j, b in enumerate(new, start=1):
            row[j] = prev[j - 1] + 1 if same(a, b) else max(prev[j], row[j - 1])
        prev = row
    return prev[-1]


# --- properties -----------------------------------------------------------------------


@SETTINGS
@given(old=histories(), data=st.data())
def test_edits_then_tail_rebuild_new(old: list[Message], data: st.DataObject) -> None:
    new = old
    for _ in range(data.draw(st.integers(1, 4))):
        new = mutate(new, data)
    edits, tail = split_append(old, new)
    assert_valid_batch(edits, len(old))
    assert apply_directives(old, edits) + tail == new
    assert diff_messages(old, new) == edits


@SETTINGS
@given(old=histories(), new=histories())
def test_unrelated_histories(old: list[Message], new: list[Message]) -> None:
    edits, tail = split_append(old, new)
    assert_valid_batch(edits, len(old))
    assert apply_directives(old, edits) + tail == new


@SETTINGS
@given(old=histories(), data=st.data(), budget=st.integers(1, 4))
def test_small_search_budget_stays_correct(
    old: list[Message], data: st.DataObject, budget: int
) -> None:
    # Past its edit budget the search continues in stretches: maybe less minimal, never wrong.
    new = old
    for _ in range(data.draw(st.integers(1, 6))):
        new = mutate(new, data)
    with mock.patch.object(alignment_module, "_MYERS_BUDGET", budget):
        edits, tail = split_append(old, new)
        pairs = _align(old, new)
    assert_valid_batch(edits, len(old))
    assert apply_directives(old, edits) + tail == new
    assert all(a < b for a, b in itertools.pairwise(pairs))


@SETTINGS
@given(old=histories(), new=histories())
def test_alignment_is_a_longest_common_subsequence(old: list[Message], new: list[Message]) -> None:
    pairs = _align(old, new)
    assert all(a < b for a, b in itertools.pairwise(pairs))  # increasing in both
    assert len(pairs) == lcs_length(old, new)


@SETTINGS
@given(old=histories(), data=st.data())
def test_append_only_gives_no_directives(old: list[Message], data: st.DataObject) -> None:
    extra = [random_message(data) for _ in range(data.draw(st.integers(1, 4)))]
    edits, tail = split_append(old, old + extra)
    assert edits == []
    assert tail == extra
    assert diff_messages(old, old + extra) == []


@SETTINGS
@given(old=histories())
def test_identical_lists_give_nothing(old: list[Message]) -> None:
    assert split_append(old, list(old)) == ([], [])


@SETTINGS
@given(old=histories(), data=st.data())
def test_policy_modes_and_forced_modes(old: list[Message], data: st.DataObject) -> None:
    new = mutate(mutate(old, data), data)
    for mode in ("amortize", "forget"):
        assert {d.mode for d in diff_messages(old, new, mode=mode)} <= {mode}
    seen: list[EditContext] = []

    def spy(edit: EditContext) -> Mode:
        seen.append(edit)
        return default_policy(edit)

    edits = diff_messages(old, new, policy=spy)
    assert len(seen) == len(edits)
    for edit, directive in zip(seen, edits):
        assert list(edit.old_messages) == old[directive.span.start : directive.span.end]
        assert list(edit.new_messages) == directive.replacement
        assert directive.mode == default_policy(edit)


# --- examples -----------------------------------------------------------------------------


def test_truncated_tool_output_is_a_one_message_replacement() -> None:
    old = [
        user("run it", "u1"),
        assistant("", "a1", ["c1"]),
        tool("x" * 500, "c1", "t1"),
        assistant("it printed x", "a2"),
    ]
    new = [*old[:2], old[2].model_copy(update={"content": "x" * 20 + "[truncated]"}), old[3]]
    (edit,) = diff_messages(old, new, policy=default_policy)
    assert (edit.span.start, edit.span.end) == (2, 3)
    assert edit.replacement == [new[2]]
    assert edit.mode == "amortize"


def test_matching_without_ids_uses_rendering() -> None:
    old = [user("a"), assistant("b"), user("c"), assistant("d")]
    new = [user("a"), user("c"), assistant("d")]
    (edit,) = diff_messages(old, new)
    assert (edit.span.start, edit.span.end, edit.replacement) == (1, 2, [])


def test_same_rendering_different_ids_is_replaced() -> None:
    old = [user("hi", "u1")]
    new = [user("hi", "u2")]
    (edit,) = diff_messages(old, new)
    assert edit.replacement == new and edit.mode == "amortize"  # id only: nothing to forget
    assert (
        default_policy(EditContext(old_messages=old, new_messages=new, start=0, total_messages=1))
        == "amortize"
    )


def test_insertion_next_to_a_replacement_is_merged() -> None:
    old = [user("q", "u1"), assistant("long", "a1"), user("next", "u2")]
    new = [user("q", "u1"), user("aside"), assistant("short", "a1"), user("next", "u2")]
    (edit,) = diff_messages(old, new)
    assert (edit.span.start, edit.span.end) == (1, 2)
    assert edit.replacement == new[1:3]


def test_edit_of_last_message_with_append() -> None:
    old = [user("q"), assistant('{"a": 1}')]
    new = [user("q"), assistant('{"a":1}'), user("thanks"), assistant("np")]
    edits, tail = split_append(old, new)
    assert [(d.span.start, d.span.end) for d in edits] == [(1, 2)]
    assert edits[0].replacement == [new[1]]
    assert tail == new[2:]


def test_edits_prefer_late_positions() -> None:
    old = [user("go"), assistant("ok"), user("go"), assistant("ok")]
    new = [user("go"), assistant("ok"), user("go")]
    (edit,) = diff_messages(old, new)
    assert (edit.span.start, edit.span.end) == (3, 4)


def test_empty_lists() -> None:
    history = [user("a"), assistant("b")]
    assert split_append([], history) == ([], history)
    (edit,) = diff_messages(history, [])
    assert (edit.span.start, edit.span.end, edit.replacement) == (0, 2, [])


def test_dict_messages_are_accepted() -> None:
    edits, tail = split_append(
        [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    )
    assert edits[0].replacement == [user("b")] and tail == []


def test_mode_and_policy_are_exclusive() -> None:
    with pytest.raises(TypeError):
        diff_messages([], [], mode="forget", policy=default_policy)


def test_long_histories_with_many_edits() -> None:
    old = [user(f"old {i % 5}") for i in range(1500)]
    new = [m if i % 3 else user(f"new {i}") for i, m in enumerate(old)] + old[:3]
    edits, tail = split_append(old, new)
    assert_valid_batch(edits, len(old))
    assert apply_directives(old, edits) + tail == new
    assert len(edits) == 500 and tail == old[:3]


# --- apply_directives ------------------------------------------------------------------------


def d(start: int, end: int, *replacement: Message) -> Directive:
    return Directive(span=Span(start=start, end=end), replacement=list(replacement))


def test_apply_orders_insertions_around_touching_spans() -> None:
    a, b, c, x, y = user("a"), user("b"), user("c"), user("x"), user("y")
    assert apply_directives([a, b, c], [d(1, 2, y), d(1, 1, x)]) == [a, x, y, c]
    assert apply_directives([a, b, c], [d(2, 2, x), d(0, 2, y)]) == [y, x, c]


def test_apply_rejects_bad_batches() -> None:
    history = [user("a"), user("b")]
    with pytest.raises(InvalidSpan):
        apply_directives(history, [d(1, 3)])
    with pytest.raises(OverlappingSpans):
        apply_directives(history, [d(0, 2), d(1, 2)])
    with pytest.raises(OverlappingSpans):
        apply_directives(history, [d(1, 1, user("x")), d(1, 1, user("y"))])
    with pytest.raises(OverlappingSpans):
        apply_directives(history, [d(0, 2), d(1, 1, user("x"))])
    token = Directive(span=Span(start=0, end=1, unit="token"), replacement="t")
    with pytest.raises(InvalidDirective):
        apply_directives(history, [token])
    assert issubclass(OverlappingSpans, InvalidDirective)


# --- default policy --------------------------------------------------------------------------


def edit(old: list[Message], new: list[Message]) -> EditContext:
    return EditContext(old_messages=old, new_messages=new, start=1, total_messages=10)


@pytest.mark.parametrize(
    ("old", "new", "mode", "reason"),
    [
        (
            [tool("long output", "c1", "t1")],
            [tool("[cleared]", "c1", "t1")],
            "amortize",
            "tool_output_edit",
        ),
        ([tool("long output", "c1")], [tool("long", "c1")], "amortize", "tool_output_edit"),
        ([assistant("", calls=["c1"]), tool("boom", "c1")], [], "amortize", "tool_attempt_edit"),
        (
            [assistant("", calls=["c1"])],
            [assistant("", calls=["c2"])],
            "amortize",
            "tool_attempt_edit",
        ),
        ([assistant("wrong answer")], [], "forget", "retraction"),
        ([assistant("wrong", "a1")], [assistant("right", "a1")], "forget", "retraction"),
        ([user("typo")], [user("fixed")], "forget", "user_correction"),
        ([user("forget this")], [], "forget", "user_correction"),
        (
            [Message(role="system", content="old rules")],
            [Message(role="system", content="new")],
            "forget",
            "instruction_edit",
        ),
        ([], [Message(role="system", content="new rules")], "forget", "instruction_edit"),
        ([], [user("extra context")], "amortize", "insertion"),
        (
            [assistant("", calls=["c1"]), tool("boom", "c1"), user("try again")],
            [],
            "forget",
            "user_correction",
        ),
    ],
)
def test_default_policy(old: list[Message], new: list[Message], mode: str, reason: str) -> None:
    assert explain_edit(edit(old, new)) == (mode, reason)
    assert default_policy(edit(old, new)) == mode


def test_force_mode() -> None:
    assert force_mode("forget")(edit([user("a")], [])) == "forget"
    with pytest.raises(ValueError):
        force_mode("sometimes")  # type: ignore[arg-type]


# --- edit intent -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "intent"),
    [
        ([tool("long output", "c1", "t1")], [tool("[cleared]", "c1", "t1")], "shrink"),  # cleared
        ([tool("long output", "c1")], [tool("long", "c1")], "shrink"),  # truncated
        ([tool("error: timeout", "c1")], [tool("42 files changed", "c1")], "erase"),  # a corrected result
        ([assistant("", calls=["c1"]), tool("boom", "c1")], [], "shrink"),  # a failed attempt dropped
        ([assistant("wrong", "a1")], [assistant("right", "a1")], "erase"),  # retracted
        ([user("my key is sk-123")], [user("my key is [removed]")], "erase"),  # a user's correction
        ([Message(role="system", content="old rules")], [Message(role="system", content="new")], "erase"),
        ([], [user("extra context")], "shrink"),  # an insertion
        ([user("an old question")], [], "shrink"),  # an old turn trimmed
        ([user("q1"), assistant("a1"), user("q2")], [user("summary: q1 answered, q2 asked")], "shrink"),
    ],
)
def test_edit_intent(old: list[Message], new: list[Message], intent: str) -> None:
    assert edit_intent(edit(old, new)) == intent


def test_split_append_reads_each_edits_intent_when_asked() -> None:
    old = [user("q"), assistant("", calls=["c1"]), tool("error: timeout", "c1"), assistant("", calls=["c2"]),
           tool("a long listing of every file", "c2"), user("next")]
    new = [*old[:2], tool("42 files changed, 3 renamed", "c1"), old[3], tool("[cleared]", "c2"), old[5]]
    directives, tail = split_append(old, new, intent=edit_intent)
    assert [(x.span.start, x.intent) for x in directives] == [(2, "erase"), (4, "shrink")] and tail == []
    assert {x.intent for x in split_append(old, new)[0]} == {"shrink"}  # not asked: every edit a shrink
    assert {x.intent for x in split_append(old, new, intent="erase")[0]} == {"erase"}
    wire = DirectiveBatch(session_id="s", directives=directives).model_dump(mode="json")
    assert DirectiveBatch.model_validate(wire).directives == directives  # the field survives the wire
