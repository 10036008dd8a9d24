"""The runtime's settings and their defaults, in one torch-free module.

``leyline-runtime --help`` reads its defaults and choices from here, so the
command line and the code it configures cannot disagree, and building the
parser imports neither torch nor FastAPI (tests/repo/test_cli_light.py checks it).
This module imports nothing from the rest of the runtime but the (torch-free) rule of mode auto.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leyline_runtime.auto_rule import AutoConfig  # mode auto's thresholds, shared with the vLLM plugin

DTYPES = ("float32", "bfloat16")
CPU_GEMMS = ("auto", "blas", "onednn")  # libraries for fp32 CPU products (model.layers.set_cpu_gemm)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle keep-alive connection stays open
MIB = 2**20


@dataclass
class RuntimeConfig:
    model_path: str | None = None  # None: the embedded default model
    dtype: str = "float32"  # one of DTYPES
    device: str = "cpu"
    max_cache_tokens: int = 65536
    block_size: int = 16
    prefill_chunk: int = 8192  # the most tokens one forward prefills (activation memory)
    max_batched_tokens: int = 512  # tokens per step while sequences decode (prefill chunks share it)
    max_num_seqs: int = 64  # generations decoding in one step
    api_keys: list[str] = field(default_factory=list)
    model_name: str = "leyline-default"
    auto: AutoConfig = field(default_factory=AutoConfig)  # mode "auto" thresholds and the drift budget
    max_request_tokens: int | None = None  # new tokens one request may add; None: the model's context
    # A sequence's logits bit-equal alone or batched (padded products, fixed prefill cuts; Engine)
    batch_invariant: bool = False


@dataclass
class Limits:
    """What one request may ask of the server (enforced by server/limits.py)."""

    max_body_bytes: int = 8 * MIB
    max_message_bytes: int = 1 * MIB  # content + name + tool calls of one message, UTF-8
    max_messages: int = 4096  # per request
    body_timeout: float = 30.0  # seconds to receive the whole body
