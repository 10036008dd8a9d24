"""Streams closed mid-generation leave every session holding exactly the blocks its tokens need.

A closed stream makes the generation's token hook raise (server/sse.py:
``GenerationCancelled``); the session keeps the request's new messages, not the reply. The defect
this guards: when the history ended on a block boundary, the assistant header's
block (taken before decoding began) stayed with the session, 9 blocks for 8
blocks' worth of tokens, one block lost from the pool per such session.
"""

from __future__ import annotations

import pytest

from leyline_sdk.protocol import GenerateRequest, Message, SessionCreate
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.server.sse import GenerationCancelled

STREAMS = 20
TOKENS_BEFORE_CLOSE = 3


@pytest.fixture(scope="module")
def rt():
    return Runtime(RuntimeConfig(max_cache_tokens=65536, block_size=16))


def closes_after(n: int):
    seen = []

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) >= n:
            raise GenerationCancelled()
    return on_token


def test_twenty_streams_closed_mid_generation_leave_no_block_behind(rt):
    free = rt.blocks.num_free
    sids, aligned = [], 0
    for i in range(STREAMS):  # new messages of consecutive lengths: some end on a block boundary
        sid = rt.create_session(SessionCreate(messages=[Message(role="system", content="Be brief.")])).session_id
        sids.append(sid)
        before = rt.get_session(sid, include_messages=True)
        question = Message(role="user", content="a" + " a" * i)
        aligned += (before.num_tokens + len(rt.tokenizer.encode_message(question))) % rt.blocks.block_size == 0
        with pytest.raises(GenerationCancelled):  # a streamed request: its new message, then the reply
            rt.generate(sid, GenerateRequest(max_tokens=32, temperature=0.0, messages=[question]),
                        on_token=closes_after(TOKENS_BEFORE_CLOSE))
        after = rt.get_session(sid, include_messages=True)
        assert after.messages == [*before.messages, question]  # the request's message stays, the reply not
        session = rt._sessions[("default", sid)]
        assert len(session.table.blocks) == rt.blocks.blocks_for(session.num_tokens), \
            f"{len(session.table.blocks)} blocks for {session.num_tokens} tokens"
    assert aligned >= 1, "no history ended on a block boundary: the test would not see the defect"
    held = sum(len(rt._sessions[("default", sid)].table.blocks) for sid in sids)
    assert rt.blocks.num_free == free - held
    for sid in sids:
        rt.delete_session(sid)
    assert rt.blocks.num_free == free


def test_a_closed_stream_then_a_full_one(rt):
    """The session still generates normally afterwards and ends with its exact blocks."""
    sid = rt.create_session(SessionCreate(messages=[Message(role="system", content="Be brief.")])).session_id
    with pytest.raises(GenerationCancelled):
        rt.generate(sid, GenerateRequest(max_tokens=16, temperature=0.0,
                                         messages=[Message(role="user", content="Say hello.")]),
                    on_token=closes_after(1))
    rt.generate(sid, GenerateRequest(max_tokens=6, temperature=0.0))
    session = rt._sessions[("default", sid)]
    assert len(session.table.blocks) == rt.blocks.blocks_for(session.num_tokens)
    rt.delete_session(sid)
