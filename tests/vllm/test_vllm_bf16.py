"""bf16 caches wherever the tests run: one ``vllm serve`` of a GLM-4 checkpoint (GPT-J pairing, partial
rotary: the layout where rounding has the most room) with ``--dtype bfloat16`` forced. The family tests
run bf16 only on CPUs with AMX (vLLM's CPU default elsewhere is fp32), so without this a machine like the
2-core EPYC never checks the splice against bf16 rows.

Checks: spliced; amortize's moved layer-0 rows within bf16 rounding of a fresh prefill's
(``tolerances.TOLERANCE``: rounded before and after the rotation, vLLM rotating with a bf16 cos/sin
cache); the same splice without rotation is far off; forget gives vLLM's own greedy tokens.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from leyline_bench.vllm.checks import (
    EDITED_INDEX,
    REPLACEMENT,
    amortize_once,
    edit_directive,
    edited,
    fresh_completion,
    greedy,
    history,
    layer0_errors,
    moved_layer0,
    splice_info,
    split_rope,
)
from leyline_testkit.tiny_models import make_tiny_checkpoint
from leyline_testkit.vllm_server import VllmServer
from leyline_sdk import LeylineClient

from test_vllm_directives import assert_same_generation
from tolerances import TOLERANCE

FAMILY = "glm4"
NO_ROTATE = "bf16-norotate"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt-bf16"), FAMILY)
    env = {"LEYLINE_VLLM_DEBUG_ROUTES": "1", "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS": NO_ROTATE,
           # mode auto with a threshold every measured drift passes: its forget path
           "LEYLINE_VLLM_AUTO": json.dumps({"signal_window": 32, "short_tail": 32, "forget_threshold": 0.0})}
    with VllmServer(checkpoint, tmp_path_factory.mktemp("serve-bf16"), env=env, block_size=32,
                    dtype="bfloat16") as s:
        yield s


@pytest.fixture()
def client(server):
    with LeylineClient(server.base_url, timeout=600) as c:
        yield c


def _moved(client, server, session_id: str):
    outcome = amortize_once(client, session_id)
    assert outcome.applied_mode == "amortize" and outcome.rotated_tokens >= 64, outcome
    return moved_layer0(client, server.base_url, session_id, outcome)


def test_bf16_splice_is_within_bf16_rounding_of_a_fresh_prefill(server, client):
    splice = splice_info(server.base_url)
    assert splice["supported"] and splice["pair_layout"] == "interleaved", splice
    assert splice["rotary_dim"] < splice["row_width"] // 2, splice  # partial rotary
    rotary_err, rest_err = layer0_errors(splice, *_moved(client, server, "bf16-amortize"))
    print(f"\nbf16 {FAMILY}: layer-0 rotary dims max error {rotary_err:.2e} (of the largest), other {rest_err:.2e}")
    assert rotary_err <= TOLERANCE["bfloat16"].rotary and rest_err <= TOLERANCE["bfloat16"].other


def test_bf16_unrotated_splice_fails_the_same_check(server, client):
    splice = splice_info(server.base_url)
    got, want = (split_rope(splice, t) for t in _moved(client, server, NO_ROTATE))
    assert np.abs(got[0] - want[0]).max() > 0.1 * np.abs(want[0]).max()


def test_bf16_forget_equals_vllms_fresh_prefill(server, client):
    old, session = history(tag=uuid.uuid4().hex[:12]), "bf16-forget"
    client.create_session(old, session_id=session)
    (outcome,) = client.apply(session, [edit_directive("forget")]).outcomes
    assert outcome.applied_mode == "forget" and outcome.fallback_reason is None
    reference = fresh_completion(server.base_url, server.model, edited(old, EDITED_INDEX, REPLACEMENT), 6)
    assert_same_generation(greedy(client, session, 6), reference, TOLERANCE["bfloat16"].logprob)


def test_auto_over_its_threshold_forgets_and_keeps_the_window(server, client):
    """Mode auto whose measured drift passes the threshold (this server's is 0): applied as forget, the
    window computed for the signal kept (not computed twice), and the answer is vLLM's own on the edited
    history."""
    old, session = history(tag=uuid.uuid4().hex[:12]), "bf16-auto"
    client.create_session(old, session_id=session)
    (outcome,) = client.apply(session, [edit_directive("auto")]).outcomes
    assert (outcome.requested_mode, outcome.applied_mode) == ("auto", "forget"), outcome
    assert outcome.auto.choice == "forget" and outcome.auto.reason == "signal" and outcome.auto.layer1_change > 0
    assert outcome.rotated_tokens == 0 and outcome.fallback_reason is None
    new = edited(old, EDITED_INDEX, REPLACEMENT)
    got = greedy(client, session)
    want = fresh_completion(server.base_url, server.model, new, 6)
    assert_same_generation(got, want, TOLERANCE["bfloat16"].logprob)
