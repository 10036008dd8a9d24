"""The *floor* of a replayed session: the prompt tokens no engine can avoid computing.

At each model call an agent sends its whole history (a list of token ids once rendered). The
floor of turn ``t`` is

    floor(t) = len(h_t) - LCS(h_{t-1}, h_t),        h_0 = []

where ``LCS`` is the length of the longest common subsequence of the two token-id lists: the
tokens of this turn's history that are not present, in order, in the previous turn's history.
Any engine that keeps every row of the previous request and may reuse a row wherever it moved
(rotated, as Leyline's amortize does, or shifted, as llama.cpp's ``--cache-reuse`` does) still has
to compute those tokens: they are new (the model's reply, the next observation) or changed (a
placeholder, a truncation marker, a summary). It is a lower bound, not a schedule: a reused token
is counted as free even where its cached row saw other tokens before it. The last prompt token,
which engines always compute to produce logits, is not added.

``lcs_length`` is Hyyrö's bit-parallel LCS (one Python big integer as the bit vector, a few
big-integer operations per token of the second list): ~20 ms for two 8k-token lists, where a
dynamic-programming table would hold 64M cells.

Beside the floor, ``prefix_cache_computed`` counts what an engine that reuses only a common prefix
(vLLM's prefix caching) computes on the same calls: the two ends every measured arm sits between.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..common.prefix import common_prefix_length


def lcs_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (exact)."""
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1  # a common prefix is part of some LCS: skip it (most of a turn's history)
    end = 0
    while end < len(a) - start and end < len(b) - start and a[-1 - end] == b[-1 - end]:
        end += 1  # so is a common suffix
    a_mid, b_mid = a[start:len(a) - end], b[start:len(b) - end]
    return start + end + _bit_parallel_lcs(a_mid, b_mid)


def _bit_parallel_lcs(a: Sequence[int], b: Sequence[int]) -> int:
    """Hyyrö (2004): bit i of ``v`` is 0 where row i of the LCS table steps up; the zeros count the LCS."""
    if not a or not b:
        return 0
    masks: dict[int, int] = {}
    for i, token in enumerate(a):
        masks[token] = masks.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for token in b:
        match = masks.get(token)
        if match is None:
            continue  # no position of ``a`` holds it: the row does not change
        u = v & match
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def turn_floors(histories: Sequence[Sequence[int]]) -> list[int]:
    """floor(t) for every turn of one session, its histories' token ids in call order."""
    floors, previous = [], []
    for ids in histories:
        floors.append(len(ids) - lcs_length(previous, ids))
        previous = ids
    return floors


def stream_floors(sessions: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """floor(t) for sessions replayed one after the other on one server. A session's first call has no
    previous call of its own: its floor is its tokens beyond the common prefix with the call the server
    saw just before (the previous session's last call), i.e. the system prompt every session of the agent
    shares, which a server may hold across sessions (a prefix cache, shared exact rows, llama.cpp's slot)."""
    out, last = [], None
    for histories in sessions:
        floors = turn_floors(histories)
        if floors and last is not None:
            floors[0] = len(histories[0]) - common_prefix_length(last, histories[0])
        if histories:
            last = histories[-1]
        out.append(floors)
    return out


def prefix_cache_computed(sessions: Sequence[Sequence[Sequence[int]]], block: int) -> list[list[int]]:
    """Per call, the prompt tokens an engine computes that reuses the longest block-aligned prefix the call
    shares with the request before it (sessions one after the other on one server, as :func:`stream_floors`
    chains them). As vLLM does, at least the last token is computed (a whole-prompt hit still needs its logits):
    the hit is ``min(prefix, len - 1)`` rounded down to a block. Only the previous request is compared (a cache
    that never evicts could hold an older, longer match; on these policies an edit changes every later call,
    so the previous request holds the longest one)."""
    out, last = [], None
    for histories in sessions:
        computed = []
        for ids in histories:
            shared = common_prefix_length(last, ids) if last is not None else 0
            computed.append(len(ids) - min(shared, len(ids) - 1) // block * block)
            last = ids
        out.append(computed)
    return out
