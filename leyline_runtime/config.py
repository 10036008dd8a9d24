"""The runtime's settings and their defaults, in one torch-free module.

``leyline-runtime --help`` reads its defaults and choices from here, so the
command line and the code it configures cannot disagree, and building the
parser imports neither torch nor FastAPI (tests/repo/test_cli_light.py checks it).
This module imports nothing from the rest of the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("float32", "bfloat16")
CPU_GEMMS = ("auto", "blas", "onednn")  # libraries for fp32 CPU products (model.layers.set_cpu_gemm)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle keep-alive connection stays open
MIB = 2**20


@dataclass
class AutoConfig:
    """Mode "auto"'s thresholds and the per-session drift budget (see directives/auto_mode.py)."""

    # Calibrated with `leyline-bench fidelity --policies ...` (docs/perf/fidelity_policies.md)
    # on the default model and its 12/18-layer stacks, sessions 0-1 (the docs report others).
    forget_threshold: float = 8.0  # on the edit's drift: layer-1 change x (num_layers - 1)
    # On the edit's drift x the attention the next turn pays it; None: never. Off by default: in
    # the calibration a 32-row tail repair after every edit cost 0.034 of forget's recompute and
    # bought next-turn top-1 +0.0003..+0.0014, while the same rows spent on an earlier drift-budget
    # repair bought +0.002..+0.003 (a repair makes every row exact; a tail repair recomputes the
    # tail against the stale rows before it).
    repair_threshold: float | None = None
    short_tail: int = 128  # at most this many tokens after the edit: forget (a repair would cost as much)
    repair_tail: int = 32
    signal_window: int = 64
    attention_queries: int = 8  # newest positions whose layer-0 attention stands in for the next turn's
    # In drift units (layer-1 change x (num_layers - 1)): deeper models pass it sooner. 14 from the
    # calibration sessions of run 8's weights, the default model before run 9 (budgets 9/10/12/14 on
    # the 18-layer stack cost 21.2/20.5/15.0/11.9% of forget's recompute at next-turn top-1
    # 0.991/0.991/0.990/0.991; with 14 the 6- and 12-layer models keep 0.997 and 0.994).
    drift_budget: float | None = 14.0


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
