"""A real ``vllm serve`` (vLLM + Leyline's plugins) on 127.0.0.1 for this folder's tests.

Run with ``make test-vllm`` (it builds ``.venv-vllm``). The main suite does not
collect this folder (``tests/conftest.py``). One server serves every test: its
start costs minutes on a small CPU. Test hooks in its environment: the sessions
in ``FAULT_SESSIONS`` get a fault injected into their loads after layer 0 is
written; those in ``NO_ROTATE_SESSIONS`` get rows copied without rotation; those in
``SPILL_SESSIONS`` have each hold moved to the host tier (on, 0.25 GiB) as soon as it is made; mode
``auto`` runs with ``AUTO_AMORTIZES``.
"""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm` (builds .venv-vllm)")

from leyline_bench.vllm.tiny_models import make_tiny_mla_checkpoint  # noqa: E402
from leyline_bench.common.vllm_server import VllmServer  # noqa: E402

FAULT_SESSIONS = ["fault-amortize", "fault-forget"]
NO_ROTATE_SESSIONS = ["norotate-amortize"]
SPILL_SESSIONS = ["spill-amortize"]  # their holds go to the host tier as soon as they are made
# mode auto on this server: a 32-token signal window, and a threshold no drift reaches (its amortize path;
# the bf16 server takes the forget path, the GQA family servers the drift-budget repair)
AUTO_AMORTIZES = {"signal_window": 32, "short_tail": 32, "forget_threshold": 1e9, "drift_budget": None}


# While iterating: reuse a server started with the same environment (and its checkpoint folder).
REUSE_URL = os.environ.get("LEYLINE_VLLM_TEST_URL")
REUSE_CHECKPOINT = os.environ.get("LEYLINE_VLLM_TEST_CHECKPOINT")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    if REUSE_CHECKPOINT:
        return REUSE_CHECKPOINT
    return make_tiny_mla_checkpoint(tmp_path_factory.mktemp("tiny-mla"))


@pytest.fixture(scope="session")
def server(checkpoint, tmp_path_factory):
    if REUSE_URL:
        yield type("Reused", (), {"base_url": REUSE_URL, "dtype": os.environ.get("LEYLINE_VLLM_TEST_DTYPE", "float32")})()
        return
    env = {"LEYLINE_VLLM_TEST_FAULT_SESSIONS": ",".join(FAULT_SESSIONS),
           "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS": ",".join(NO_ROTATE_SESSIONS),
           "LEYLINE_VLLM_TEST_SPILL_SESSIONS": ",".join(SPILL_SESSIONS), "LEYLINE_VLLM_HOST_TIER_GIB": "0.25",
           "LEYLINE_VLLM_DEBUG_ROUTES": "1", "LEYLINE_VLLM_AUTO": json.dumps(AUTO_AMORTIZES)}
    with VllmServer(checkpoint, tmp_path_factory.mktemp("vllm-serve"), env=env) as srv:
        print(f"\nvllm serve started in {srv.startup_s:.0f} s ({srv.dtype}) at {srv.base_url}")
        yield srv


@pytest.fixture(scope="session")
def base_url(server):
    return server.base_url


@pytest.fixture(scope="session")
def block(base_url) -> int:
    """vLLM's KV block size (16 on CPU MLA, other sizes elsewhere), from its cache_config_info metric."""
    found = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', httpx.get(f"{base_url}/metrics").text)
    assert found, "vLLM's /metrics has no cache_config_info"
    return int(found.group(1))
