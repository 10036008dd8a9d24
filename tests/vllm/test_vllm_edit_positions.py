"""Directives carried as positions inside ``vllm serve``: the row plan moves the tokens each directive
declared (its message span's token range, from the chat template's message bounds), never a run re-found
by comparing token ids, so edits a token diff would mistake for one another reach the right rows.

Each check compares the outcome's ``token_start`` / ``token_end`` / ``delta`` with what a fresh
tokenisation says (the sessions' segments, before and after the batch), and the edited session's layer-0
rows with a fresh session's of the same history: at layer 0 a row depends only on its token and
position, so a row moved to the wrong place, or a token computed where another belongs, is far off.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from leyline_bench.vllm.checks import REPLACEMENT, history, rows
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Message, Span


@pytest.fixture()
def client(base_url):
    with LeylineClient(base_url, timeout=600) as c:
        yield c


def own_history() -> list[Message]:
    return history(n=10, tag=uuid.uuid4().hex[:12])


def apply_and_check(client, base_url, tol, old: list[Message], directives: list[Directive]):
    """Apply ``directives`` to a session on ``old``; check every outcome's token range and delta against the
    fresh tokenisations, and every layer-0 row against a fresh session's of the edited history."""
    s = f"pos-{uuid.uuid4().hex[:8]}"
    before = client.create_session(old, session_id=s).segments
    result = client.apply(s, directives)
    after = client.get_session(s).segments
    fresh = client.create_session(client.get_session(s, include_messages=True).messages,
                                  session_id=f"fresh-{s}")
    assert fresh.num_tokens == result.num_tokens
    order = sorted(range(len(directives)), key=lambda i: directives[i].span.start)
    shift = 0
    for i in order:  # outcomes are in span order
        d, outcome = directives[i], result.outcomes[order.index(i)]
        start = before[d.span.start].start if d.span.start < len(before) else before[-1].end
        end = before[d.span.end - 1].end if d.span.end > d.span.start else start
        first = d.span.start + shift
        shift += len(d.replacement) - (d.span.end - d.span.start)
        new_len = (after[first + len(d.replacement) - 1].end - after[first].start) if d.replacement else 0
        assert (outcome.token_start, outcome.token_end, outcome.delta) == (start, end, new_len - (end - start)), \
            (i, outcome)
    n = result.num_tokens
    got, want = rows(base_url, s, 0)[:n], rows(base_url, fresh.session_id, 0)[:n]
    worst = np.abs(got - want).max() / np.abs(want).max()
    assert worst <= max(tol.rotary, tol.prefill_row), worst
    return result


def test_two_identical_edits_in_one_batch_reach_their_own_rows(client, base_url, tol, block):
    """The same replacement at two places: each outcome sits where its directive put it, and the run
    between the two (the longer one here) is moved to its place, not to the other edit's."""
    old = own_history()
    result = apply_and_check(client, base_url, tol, old, [
        Directive(span=Span(start=2, end=3), replacement=REPLACEMENT, mode="amortize"),
        Directive(span=Span(start=7, end=8), replacement=REPLACEMENT, mode="amortize")])
    first, second = result.outcomes
    assert (first.applied_mode, first.fallback_reason) == ("amortize", None), first
    # vLLM moves one run per batch: the four messages after the first edit, not the two after the second
    assert (second.applied_mode, second.fallback_reason) == ("forget", "one_run_per_batch"), second
    assert first.rotated_tokens >= 4 * block, first


def test_a_copy_inserted_before_its_original_moves_the_original(client, base_url, tol, block):
    """Merges across a span's edge cannot happen here: the chat template wraps every message in
    ``<|role|>`` ... ``<|end|>``, special tokens the tokenizer never merges with text (and the renderer
    refuses a template whose message boundary falls inside a token). The closest real case is an edit
    whose edge tokenizes exactly like its neighbour: a message inserted before an identical copy of it.
    A token diff matches the inserted copy with the original and would put the edit one message later;
    the directive says it was inserted here, so the original's rows are moved after the copy."""
    old = own_history()
    (outcome,) = apply_and_check(client, base_url, tol, old, [
        Directive(span=Span(start=4, end=4), replacement=[old[4]], mode="amortize")]).outcomes
    assert outcome.token_start == outcome.token_end and outcome.delta > 0, outcome
    assert (outcome.applied_mode, outcome.fallback_reason) == ("amortize", None), outcome
    assert outcome.rotated_tokens >= 4 * block, outcome
