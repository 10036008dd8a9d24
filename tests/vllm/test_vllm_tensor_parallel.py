"""The connector under tensor parallelism (``-tp 2``): every rank's worker holds its share of the KV
heads, probes its own cache and moves and rotates its own rows; the row plans (token positions and
blocks) and the one scheduler side are shared. One ``vllm serve -tp 2`` of a tiny Qwen3 (2 KV heads: one
per rank), each rank's OpenMP threads bound to a core of their own (on CPU vLLM binds by NUMA node, and a
2-core machine has one). Checked as for one rank: the verdict, amortize's moved layer-0 rows of *each
rank's* head equal a fresh prefill's, forget equals vLLM's own answer, and mode auto measures its window
on both ranks (their mean is the signal).
"""

from __future__ import annotations

import os
import uuid

import pytest

from leyline_bench.vllm.checks import (
    EDITED_INDEX,
    REPLACEMENT,
    edit_directive,
    edited,
    fresh_completion,
    greedy,
    history,
    layer0_errors,
    rows,
    splice_info,
)
from leyline_testkit.tiny_models import make_tiny_checkpoint
from leyline_testkit.vllm_server import VllmServer, vllm_on_cpu
from leyline_sdk import LeylineClient

from test_vllm_directives import assert_same_generation
from tolerances import TOLERANCE

RANKS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if vllm_on_cpu() and (os.cpu_count() or 1) < RANKS:
        pytest.skip(f"-tp {RANKS} on the CPU build needs a core per rank")
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt-tp"), "qwen3")
    env = {"LEYLINE_VLLM_DEBUG_ROUTES": "1"}
    if vllm_on_cpu():
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(i) for i in range(RANKS)),
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    with VllmServer(checkpoint, tmp_path_factory.mktemp("serve-tp"), env=env,
                    extra=["-tp", str(RANKS)], block_size=32) as s:
        yield s


@pytest.fixture()
def client(server):
    with LeylineClient(server.base_url, timeout=600) as c:
        yield c


def test_every_rank_splices_its_own_heads(server, client):
    splice = splice_info(server.base_url)
    assert splice["supported"] is True and splice["kind"] == "heads", splice
    assert splice["rows_per_token"] == 1  # 2 KV heads over 2 ranks
    old, s = history(tag=f"tp-{uuid.uuid4().hex[:8]}"), f"tp-a-{uuid.uuid4().hex[:8]}"
    client.create_session(old, session_id=s)
    (outcome,) = client.apply(s, [edit_directive("amortize")]).outcomes
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens >= 64, outcome
    fresh = f"tp-fresh-{uuid.uuid4().hex[:8]}"
    client.create_session(edited(old, EDITED_INDEX, REPLACEMENT), session_id=fresh)
    first = outcome.token_end + outcome.delta
    moved = slice(first, first + outcome.rotated_tokens)
    for rank in range(RANKS):
        got, want = rows(server.base_url, s, 0, rank)[moved], rows(server.base_url, fresh, 0, rank)[moved]
        rotary, rest = layer0_errors(splice, got, want)
        assert rotary <= TOLERANCE[server.dtype].rotary and rest <= TOLERANCE[server.dtype].other, (rank, rotary, rest)
    a, b = rows(server.base_url, s, 0, 0), rows(server.base_url, s, 0, 1)
    assert a.shape == b.shape and not (a == b).all()  # two ranks, two different heads


def test_forget_and_auto_under_tensor_parallelism(server, client):
    old = history(tag=f"tp-{uuid.uuid4().hex[:8]}")
    new = edited(old, EDITED_INDEX, REPLACEMENT)
    want = fresh_completion(server.base_url, server.model, new, 6)
    tol = TOLERANCE[server.dtype].logprob
    for mode in ("forget", "auto"):
        s = f"tp-{mode}-{uuid.uuid4().hex[:8]}"
        client.create_session(old, session_id=s)
        (outcome,) = client.apply(s, [edit_directive(mode)]).outcomes
        if mode == "forget":
            assert outcome.applied_mode == "forget" and outcome.fallback_reason is None, outcome
            assert_same_generation(greedy(client, s), want, tol)
        else:  # measured on both ranks (the default threshold decides)
            assert outcome.auto.layer1_change is not None and outcome.auto.signal_tokens > 0, outcome
