"""``leyline-runtime``: the runtime's command line.

Subcommands register themselves in :data:`COMMANDS` (name -> (help, add
arguments, run)); ``serve`` starts the HTTP service.

Building the parser imports neither torch nor FastAPI (``--help`` is instant
and works without the ``runtime`` extra; tests/repo/test_cli_light.py checks it).
``serve`` checks what it can before the model load (the extra, the model
folder, the port) and reports a problem as one line.

Training and evaluating the default model is ``leyline-train``
(``leyline_training.cli``): the runtime never imports training code.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .config import (
    CPU_GEMMS,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DTYPES,
    KEEP_ALIVE_TIMEOUT,
    LOG_LEVELS,
    AutoConfig,
    Limits,
    RuntimeConfig,
)
from .extras import MissingExtra, require

Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


# --- serve ---------------------------------------------------------------------------------


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    defaults, limit_defaults = RuntimeConfig(), Limits()
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="Hugging Face style model folder (config.json + *.safetensors + tokenizer.json); "
                        "default: the embedded default model")
    p.add_argument("--dtype", choices=list(DTYPES), default=defaults.dtype,
                   help="weights and KV cache dtype (default: %(default)s)")
    p.add_argument("--device", default=defaults.device, help="torch device, e.g. cpu or cuda (default: %(default)s)")
    p.add_argument("--max-cache-tokens", type=int, metavar="N", default=defaults.max_cache_tokens,
                   help="KV cache budget in tokens, all sessions together; idle sessions are evicted "
                        "(least recently used first) when it is full (default: %(default)s)")
    p.add_argument("--api-key", dest="api_keys", metavar="KEY", action="extend", nargs="+", default=[],
                   help="accept this API key (repeatable); each key is a tenant. Without keys the "
                        "service is open, unless LEYLINE_API_KEYS (comma-separated) is set")
    p.add_argument("--model-name", default=defaults.model_name,
                   help="model id reported by /v1/models and in completions (default: %(default)s)")
    p.add_argument("--drift-budget", type=_drift_budget, metavar="X", default=AutoConfig().drift_budget,
                   help="per-session budget for the drift that mode \"auto\" edits leave (the sum of their "
                        "measured layer-1 change x (layers - 1)); past it the session is re-prefilled from "
                        "its earliest drifted token. 'none' turns repairs off (default: %(default)s)")
    p.add_argument("--threads", type=int, metavar="N", default=None,
                   help="torch CPU threads (default: torch's choice)")
    p.add_argument("--cpu-gemm", choices=list(CPU_GEMMS), default="auto",
                   help="library for fp32 matrix products on the CPU: blas (torch's MKL), onednn, or auto: "
                        "oneDNN except on Intel CPUs, where MKL takes its fast kernels; --batch-invariant always "
                        "uses oneDNN (default: %(default)s)")
    sched = p.add_argument_group("scheduling (see docs/operations.md)")
    sched.add_argument("--max-num-seqs", type=_positive, metavar="N", default=defaults.max_num_seqs,
                       help="generations decoding together in one step; more take turns (default: %(default)s)")
    sched.add_argument("--max-batched-tokens", type=_positive, metavar="N", default=defaults.max_batched_tokens,
                       help="tokens per step while sequences decode; prefill chunks fill what decode steps "
                            "leave (default: %(default)s)")
    sched.add_argument("--batch-invariant", action="store_true",
                       help="a sequence's tokens and logprobs are bit-equal whether it runs alone or batched "
                            "with others: products padded to 16 rows, prefills cut every --max-batched-tokens "
                            "tokens (costs lone requests speed; see docs/design.md)")
    limits = p.add_argument_group("request limits and timeouts (see docs/operations.md)")
    limits.add_argument("--max-body-bytes", type=int, metavar="N", default=limit_defaults.max_body_bytes,
                        help="largest request body; larger is 413 request_too_large, unread (default: %(default)s)")
    limits.add_argument("--max-message-bytes", type=int, metavar="N",
                        default=limit_defaults.max_message_bytes,
                        help="largest message text (content, name, tool calls; UTF-8 bytes) (default: %(default)s)")
    limits.add_argument("--max-messages", type=int, metavar="N", default=limit_defaults.max_messages,
                        help="most messages in one request (default: %(default)s)")
    limits.add_argument("--max-request-tokens", type=int, metavar="N", default=None,
                        help="most new tokens one request may add (messages, replacements); "
                             "default: the model's context")
    limits.add_argument("--body-timeout", type=float, metavar="SECONDS", default=limit_defaults.body_timeout,
                        help="time a client has to send its whole request body; slower is 408 request_timeout "
                             "and the connection is closed (default: %(default)s)")
    limits.add_argument("--keep-alive-timeout", type=int, metavar="SECONDS", default=KEEP_ALIVE_TIMEOUT,
                        help="close idle keep-alive connections after this long (default: %(default)s)")
    limits.add_argument("--max-connections", type=int, metavar="N", default=None,
                        help="most concurrent connections and requests; more get 503 (default: no limit)")
    p.add_argument("--admin-key", dest="admin_keys", metavar="KEY", action="extend", nargs="+", default=[],
                   help="an API key that sees every tenant's /metrics (repeatable; also a tenant of its own)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="save every session's message history here on shutdown (SIGTERM/SIGINT) and restore "
                        "it at start, so a restart costs a re-prefill instead of lost history "
                        "(default: none; sessions live in memory only)")
    p.add_argument("--log-level", default="info", choices=list(LOG_LEVELS),
                   help="server log level (default: %(default)s)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _drift_budget(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the drift budget must be a finite number >= 0, not {text!r}")
    return value


def run_serve(args: argparse.Namespace) -> int:
    require("runtime", "leyline-runtime serve")
    problem = serve_arguments_problem(args)
    if problem:
        return fail(problem)
    import uvicorn

    from .model.config import UnsupportedConfig
    from .model.layers import set_cpu_gemm
    from .server import create_app

    try:
        set_cpu_gemm(args.cpu_gemm)
    except ValueError as exc:
        return fail(f"--cpu-gemm {args.cpu_gemm}: {exc}")
    try:
        runtime = build_runtime(args)
    except (OSError, UnsupportedConfig) as exc:
        return fail(f"cannot load --model {args.model}: {exc}")
    limits = Limits(max_body_bytes=args.max_body_bytes, max_message_bytes=args.max_message_bytes,
                    max_messages=args.max_messages, body_timeout=args.body_timeout)
    app = create_app(runtime=runtime, limits=limits, admin_keys=args.admin_keys, state_dir=args.state_dir)
    keys = len(args.api_keys) or len([k for k in os.environ.get("LEYLINE_API_KEYS", "").split(",") if k.strip()])
    say(f"auth: {f'{keys} API key(s), one tenant each' if keys else 'off (no API keys)'}")
    say(f"listening on http://{args.host}:{args.port}  (OpenAI base URL: http://{args.host}:{args.port}/v1)")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_keep_alive=args.keep_alive_timeout, limit_concurrency=args.max_connections,
                h11_max_incomplete_event_size=64 * 1024)  # request line + headers
    return 0


def serve_arguments_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``serve``'s arguments, found before the (slow) model load; None if nothing."""
    for flag in ("max_cache_tokens", "max_body_bytes", "max_message_bytes", "max_messages", "body_timeout",
                 "max_request_tokens", "max_connections"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            return f"--{flag.replace('_', '-')} must be positive"
    if args.model is not None:
        problem = model_folder_problem(Path(args.model))
        if problem:
            return f"--model {args.model}: {problem}"
    return port_problem(args.host, args.port)


def model_folder_problem(folder: Path) -> str | None:
    if not folder.is_dir():
        return "no such folder (expected a Hugging Face style folder: config.json, *.safetensors, tokenizer.json)"
    config = folder / "config.json"
    if not config.is_file():
        return "no config.json in it"
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        return f"config.json is not readable JSON ({exc})"
    if not any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        return "no model.safetensors or model.safetensors.index.json in it"
    if not (folder / "tokenizer.json").is_file():
        return "no tokenizer.json in it"
    return None


def port_problem(host: str, port: int) -> str | None:
    """Bind and release the address the server will listen on (uvicorn binds with SO_REUSEADDR too)."""
    if not 0 <= port <= 65535:
        return f"--port {port} is not a port number (0-65535)"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"--host {host}: cannot resolve it ({exc.strerror})"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror} (is another server running there? choose one with --port)"
    return None


def fail(message: str) -> int:
    print(f"leyline-runtime: error: {message}", file=sys.stderr, flush=True)
    return 2


def build_runtime(args: argparse.Namespace):
    """Load model, tokenizer and cache in stages, saying what each one got."""
    import torch

    from .model import load_model
    from .model.default import DEFAULT_MODEL_DIR
    from .model.layers import cpu_vendor, linear_library
    from .runtime import Runtime
    from leyline_runtime.text.tokenizer import ChatTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    config = RuntimeConfig(model_path=args.model, dtype=args.dtype, device=args.device,
                           max_cache_tokens=args.max_cache_tokens, api_keys=list(args.api_keys),
                           model_name=args.model_name, auto=AutoConfig(drift_budget=args.drift_budget),
                           max_request_tokens=args.max_request_tokens, max_num_seqs=args.max_num_seqs,
                           max_batched_tokens=args.max_batched_tokens, batch_invariant=args.batch_invariant)
    source = args.model or f"embedded default ({DEFAULT_MODEL_DIR})"
    with stage(f"[1/3] loading model: {source}"):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        model = load_model(args.model, device=args.device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    say(f"      {params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"kv_lora_rank {cfg.kv_lora_rank}, context {cfg.max_position_embeddings}, {args.dtype} on {args.device}")
    if args.device == "cpu":
        library = linear_library(args.batch_invariant)
        why = ("--batch-invariant: its rows do not depend on the row count; bf16 ones upcast"
               if args.batch_invariant and library == "onednn"
               else f"--cpu-gemm {args.cpu_gemm}; CPU vendor {cpu_vendor() or 'unknown'}")
        say(f"      fp32 products on {library} ({why})")
    with stage("[2/3] loading tokenizer"):
        folder = args.model or DEFAULT_MODEL_DIR
        tokenizer = ChatTokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    with stage(f"[3/3] allocating KV cache: {args.max_cache_tokens} tokens"):
        runtime = Runtime(config, model=model, tokenizer=tokenizer)
    pool = runtime.pool
    mib = pool.rows.numel() * pool.rows.element_size() / 2**20
    say(f"      {pool.num_blocks} blocks of {pool.block_size} tokens, {mib:.1f} MiB")
    return runtime


class stage:
    """Prints ``label ...`` then ``done (1.2 s)``."""

    def __init__(self, label: str):
        self.label = label

    def __enter__(self) -> None:
        print(f"leyline-runtime: {self.label} ...", end=" ", flush=True)
        self.t0 = time.perf_counter()

    def __exit__(self, exc_type, exc, tb) -> None:
        print("failed" if exc_type else f"done ({time.perf_counter() - self.t0:.1f} s)", flush=True)


def say(text: str) -> None:
    print(f"leyline-runtime: {text}", flush=True)


# --- entry point ---------------------------------------------------------------------------

COMMANDS: dict[str, Command] = {
    "serve": ("serve the HTTP API (native session/directive endpoints + OpenAI-compatible /v1)",
              add_serve_arguments, run_serve),
}


def command_parser(prog: str, description: str, commands: dict[str, Command]) -> argparse.ArgumentParser:
    """A parser with one subcommand per entry of ``commands`` (``leyline-train`` uses it too)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its subcommand; a missing extra is one line naming it, exit 1."""
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except MissingExtra as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 1


def build_parser() -> argparse.ArgumentParser:
    return command_parser(
        "leyline-runtime", "Leyline inference runtime: sessions whose history is edited by directives.", COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
