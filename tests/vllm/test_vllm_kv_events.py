"""What a fleet router learns from a Leyline replica's KV events (``--kv-events-config``, ZMQ).

llm-d's precise prefix-cache scorer and Dynamo's KV router index the ``BlockStored`` / ``BlockRemoved``
events of every replica and send a request where the longest run of its blocks is cached. A router
that believes a block is an exact prefix sends requests to rows they can never use, or worse. This
server (a tiny Qwen3: standard attention, whose prefix cache vLLM keeps on every CPU, blocks of 32, a
pool of 96 blocks) publishes its events; :mod:`kv_router` indexes them as such a router does. Checked:

* after Leyline's sessions create, amortize and forget, the hit the index predicts for a plain request
  (no salt: any client's) equals the hit vLLM reports for it, for every history seen;
* no event lets a request without the session's salt match a block holding rotated rows: the plain
  request for an amortized session's edited prompt is predicted (and served) at most the exact prefix
  before the edit, while the events did store the session's blocks, salted;
* holds released (the sessions deleted) and their blocks then evicted by other requests are removed
  from the index: after the pool has turned over, every prediction still equals vLLM's hit.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from kv_router import EventSubscriber
from leyline_bench.vllm.checks import REPLACEMENT, chat_ids, edit_directive, edited, history
from leyline_testkit.tiny_models import make_tiny_checkpoint
from leyline_testkit.ports import free_port
from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer
from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Span

BLOCK = 32
POOL_BLOCKS = 96  # small enough for a few plain requests to turn the pool over


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt-qwen3-events"), "qwen3")
    port = free_port()
    # a wildcard endpoint: the publisher binds it (a host address makes it connect to a collector instead)
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    extra = ["--num-gpu-blocks-override", str(POOL_BLOCKS + 1), "--kv-events-config", json.dumps(events)]
    env = {"LEYLINE_VLLM_HOLD_FRACTION": "1", "LEYLINE_VLLM_HOST_TIER_GIB": "0"}
    subscriber = EventSubscriber(f"tcp://127.0.0.1:{port}", topic="kv")
    try:
        with VllmServer(checkpoint, tmp_path_factory.mktemp("serve-events"), env=env, extra=extra, block_size=BLOCK,
                        max_model_len=2048) as server:
            subscriber.settle()
            yield server, subscriber
    finally:
        subscriber.close()


def plain(server, ids: list[int]) -> int:
    """vLLM's own /v1/completions on ``ids`` (no session, no salt): the prompt tokens its prefix cache served."""
    body = {"model": SERVED_MODEL_NAME, "prompt": list(ids), "max_tokens": 1, "temperature": 0}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0


def check_prediction(server, subscriber, ids: list[int]) -> int:
    """The router's predicted hit for a plain request of ``ids`` equals what vLLM then serves."""
    subscriber.settle()
    predicted = subscriber.predicted_hit(ids, BLOCK)
    served = plain(server, ids)
    assert predicted == served, (predicted, served, len(ids))
    return served


def test_the_router_predicts_vllms_hits_after_leyline_edits(replica):
    server, subscriber = replica
    tag = uuid.uuid4().hex[:8]
    old = history(tag=f"events-{tag}")
    with LeylineClient(server.base_url, timeout=600) as client:
        amortized, forgot = f"ev-a-{tag}", f"ev-f-{tag}"
        for s in (amortized, forgot):
            client.create_session(old, session_id=s)
        (a,) = client.apply(amortized, [edit_directive("amortize")]).outcomes
        (f,) = client.apply(forgot, [edit_directive("forget")]).outcomes
        assert a.applied_mode == "amortize" and a.rotated_tokens > 0, a
        assert f.applied_mode == "forget", f
        subscriber.settle()
        assert subscriber.counts()["BlockStored"] > 0 and subscriber.index.stored_salted > 0
        new_ids = chat_ids(server.model, edited(old, 3, REPLACEMENT), generation_prompt=False)
        first_moved = a.token_end + a.delta  # the amortized session's rows from here on were rotated
        # the edited prompt, sent plain: the forget session's exact rows may serve it, the rotated never
        served = check_prediction(server, subscriber, new_ids)
        assert served >= first_moved - first_moved % BLOCK  # forget computed the edited history exactly
        # a plain request for the old history: its exact rows (the sessions' first snapshots) are shared
        check_prediction(server, subscriber, chat_ids(server.model, old, generation_prompt=False))
        for s in (amortized, forgot):
            client.delete_session(s)


def test_rotated_blocks_are_never_announced_unsalted(replica):
    server, subscriber = replica
    tag = uuid.uuid4().hex[:8]
    old = history(tag=f"salt-{tag}")
    with LeylineClient(server.base_url, timeout=600) as client:
        s = f"ev-s-{tag}"
        client.create_session(old, session_id=s)
        salted_before = subscriber.index.stored_salted
        (a,) = client.apply(s, [edit_directive("amortize")]).outcomes
        assert a.applied_mode == "amortize" and a.rotated_tokens >= 2 * BLOCK, a
        subscriber.settle()
        assert subscriber.index.stored_salted > salted_before  # the rotated prompt's blocks: stored, salted
        new_ids = chat_ids(server.model, edited(old, 3, REPLACEMENT), generation_prompt=False)
        first_moved = a.token_end + a.delta
        served = check_prediction(server, subscriber, new_ids)
        assert served <= a.token_start, (served, a.token_start)  # the exact prefix at most
        assert served < first_moved
        client.delete_session(s)


def test_released_and_evicted_blocks_leave_the_index(replica):
    server, subscriber = replica
    tag = uuid.uuid4().hex[:8]
    histories = [history(tag=f"evict-{tag}-{i}") for i in range(3)]
    with LeylineClient(server.base_url, timeout=600) as client:
        sessions = [f"ev-e-{tag}-{i}" for i in range(3)]
        for s, h in zip(sessions, histories):
            client.create_session(h, session_id=s)
            client.apply(s, [Directive(span=Span(start=1, end=2), mode="forget")])
        for s in sessions:  # their holds are released with the next requests
            client.delete_session(s)
    removed_before = subscriber.counts()["BlockRemoved"]
    # other traffic turns the pool over: the released blocks are evicted from vLLM's prefix cache
    for i in range(4):
        filler = history(n=16, tag=f"filler-{tag}-{i}")
        plain(server, chat_ids(server.model, filler, generation_prompt=False))
    subscriber.settle()
    assert subscriber.counts()["BlockRemoved"] > removed_before
    for h in histories:  # the index forgot what vLLM evicted: predictions still equal vLLM's hits
        ids = chat_ids(server.model, h, generation_prompt=False)
        check_prediction(server, subscriber, ids)
