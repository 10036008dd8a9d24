"""A real ``vllm serve`` (vLLM + Leyline's plugins) on 127.0.0.1 for this folder's tests.

Run with ``make test-vllm`` (it builds ``.venv-vllm``). The main suite does not
collect this folder (``tests/conftest.py``). One server serves every test: its
start costs minutes on a small CPU (test_vllm_directives adds a server for the other
MLA configuration of vllm_support). Test hooks in its environment: the sessions
in ``FAULT_SESSIONS`` get a fault injected into their loads after layer 0 is
written; those in ``NO_ROTATE_SESSIONS`` get rows copied without rotation; those in
``SPILL_SESSIONS`` have each hold moved to the host tier (on, 0.25 GiB) as soon as it is made; those in
``UNSALTED_SESSIONS`` run their approximate rows without their salt (a negative control); mode
``auto`` runs with ``AUTO_AMORTIZES``.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from leyline_testkit.tiny_models import make_tiny_mla_checkpoint
from leyline_testkit.vllm_server import VllmServer
from tolerances import TOLERANCE, Tolerance
from vllm_support import MlaConfig, cache_config

# "vllm.v1", not "vllm": with tests/ on the import path, this folder itself is a namespace package named vllm
HAVE_VLLM = importlib.util.find_spec("vllm.v1") is not None
NO_VLLM = "vLLM is not installed here: run `make test-vllm` (builds .venv-vllm)"


class _WithoutVllm(pytest.Module):
    def collect(self):
        pytest.skip(NO_VLLM)


def pytest_pycollect_makemodule(module_path, parent):
    """Without vLLM every module of this folder is skipped, not collected (their imports need vLLM)."""
    if not HAVE_VLLM:
        return _WithoutVllm.from_parent(parent, path=module_path)
    return None

FAULT_SESSIONS = ["fault-amortize", "fault-forget"]
NO_ROTATE_SESSIONS = ["norotate-amortize"]
SPILL_SESSIONS = ["spill-amortize"]  # their holds go to the host tier as soon as they are made
# negative control: their rotated rows run unsalted, so vLLM's prefix cache may hand them to anyone
UNSALTED_SESSIONS = ["unsalted-amortize"]
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


def hook_env() -> dict[str, str]:
    """The test hooks every MLA test server of this folder runs with."""
    return {"LEYLINE_VLLM_TEST_FAULT_SESSIONS": ",".join(FAULT_SESSIONS),
            "LEYLINE_VLLM_TEST_NO_ROTATE_SESSIONS": ",".join(NO_ROTATE_SESSIONS),
            "LEYLINE_VLLM_TEST_SPILL_SESSIONS": ",".join(SPILL_SESSIONS), "LEYLINE_VLLM_HOST_TIER_GIB": "0.25",
            "LEYLINE_VLLM_TEST_UNSALTED_SESSIONS": ",".join(UNSALTED_SESSIONS),
            "LEYLINE_VLLM_DEBUG_ROUTES": "1", "LEYLINE_VLLM_AUTO": json.dumps(AUTO_AMORTIZES)}


def mla_server(checkpoint, workdir, config: MlaConfig | None = None) -> VllmServer:
    """The MLA test server: in ``config`` (default: what vLLM picks on this CPU)."""
    if config is None:
        return VllmServer(checkpoint, workdir, env=hook_env())
    return VllmServer(checkpoint, workdir, env={**hook_env(), **config.env}, dtype=config.dtype,
                      extra=config.extra)


@pytest.fixture(scope="session")
def native_server(checkpoint, tmp_path_factory):
    """The MLA test model in the configuration vLLM picks on this CPU (:mod:`vllm_support`)."""
    if REUSE_URL:
        yield type("Reused", (), {"base_url": REUSE_URL, "dtype": os.environ.get("LEYLINE_VLLM_TEST_DTYPE", "float32")})()
        return
    with mla_server(checkpoint, tmp_path_factory.mktemp("vllm-serve")) as srv:
        print(f"\nvllm serve started in {srv.startup_s:.0f} s ({srv.dtype}) at {srv.base_url}")
        yield srv


@pytest.fixture(scope="session")
def server(native_server):
    return native_server


# Module scope: a module may serve its own configuration (test_vllm_directives runs both of vllm_support's).
@pytest.fixture(scope="module")
def base_url(server):
    return server.base_url


@pytest.fixture(scope="module")
def block(base_url) -> int:
    """vLLM's KV block size (16 on CPU MLA, other sizes elsewhere), from its cache_config_info metric."""
    return int(cache_config(base_url)["block_size"])


@pytest.fixture(scope="module")
def prefix_cache(base_url) -> bool:
    """Whether vLLM's own prefix cache is on (its cache_config_info metric)."""
    return cache_config(base_url)["enable_prefix_caching"] == "True"


@pytest.fixture(scope="module")
def tol(server) -> Tolerance:
    return TOLERANCE[getattr(server, "dtype", "float32")]
