"""``leyline-runtime``: the runtime's command line.

Subcommands register themselves in :data:`COMMANDS` (name -> (help, add
arguments, run)); ``serve`` starts the HTTP service.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# RuntimeConfig's defaults, repeated so that --help does not import torch
# (tests/test_server_cli.py checks they agree).
SERVE_DEFAULTS = {"dtype": "float32", "device": "cpu", "max_cache_tokens": 65536, "model_name": "leyline-default"}
DRIFT_BUDGET_DEFAULT = 24.0  # AutoConfig.drift_budget (checked by the same test)

Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


# --- serve ---------------------------------------------------------------------------------


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    defaults = argparse.Namespace(**SERVE_DEFAULTS)
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="Hugging Face style model folder (config.json + *.safetensors + tokenizer.json); "
                        "default: the embedded default model")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=defaults.dtype,
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
    p.add_argument("--drift-budget", type=_drift_budget, metavar="X", default=DRIFT_BUDGET_DEFAULT,
                   help="per-session budget for the drift that mode \"auto\" edits leave (the sum of their "
                        "measured signals); past it the session is re-prefilled from its earliest drifted "
                        "token. 'none' turns repairs off (default: %(default)s)")
    p.add_argument("--threads", type=int, metavar="N", default=None,
                   help="torch CPU threads (default: torch's choice)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default: %(default)s)")


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
    import uvicorn

    from .server import create_app

    if args.max_cache_tokens <= 0:
        print("error: --max-cache-tokens must be positive", file=sys.stderr)
        return 2
    runtime = build_runtime(args)
    app = create_app(runtime=runtime)
    keys = len(args.api_keys) or len([k for k in os.environ.get("LEYLINE_API_KEYS", "").split(",") if k.strip()])
    say(f"auth: {f'{keys} API key(s), one tenant each' if keys else 'off (no API keys)'}")
    say(f"listening on http://{args.host}:{args.port}  (OpenAI base URL: http://{args.host}:{args.port}/v1)")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def build_runtime(args: argparse.Namespace):
    """Load model, tokenizer and cache in stages, saying what each one got."""
    import torch

    from .auto_mode import AutoConfig
    from .model import load_model
    from .model.default import DEFAULT_MODEL_DIR
    from .runtime import Runtime, RuntimeConfig
    from .tokenizer import ChatTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    config = RuntimeConfig(model_path=args.model, dtype=args.dtype, device=args.device,
                           max_cache_tokens=args.max_cache_tokens, api_keys=list(args.api_keys),
                           model_name=args.model_name, auto=AutoConfig(drift_budget=args.drift_budget))
    source = args.model or f"embedded default ({DEFAULT_MODEL_DIR})"
    with stage(f"[1/3] loading model: {source}"):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        model = load_model(args.model, device=args.device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    say(f"      {params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"kv_lora_rank {cfg.kv_lora_rank}, context {cfg.max_position_embeddings}, {args.dtype} on {args.device}")
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

def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    from leyline_training import train
    train.add_arguments(p)


def _run_train(args: argparse.Namespace) -> int:
    from leyline_training import train
    train.run(args)
    return 0


def _add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    from leyline_training import evaluate
    evaluate.add_arguments(p)


def _run_evaluate(args: argparse.Namespace) -> int:
    from leyline_training import evaluate
    evaluate.run(args)
    return 0


COMMANDS: dict[str, Command] = {
    "serve": ("serve the HTTP API (native session/directive endpoints + OpenAI-compatible /v1)",
              add_serve_arguments, run_serve),
    "train": ("train the embedded default model from scratch on local data (resumable, time budget)",
              _add_train_arguments, _run_train),
    "evaluate": ("held-out perplexity and agent-loop evaluation of a model through the runtime",
                 _add_evaluate_arguments, _run_evaluate),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leyline-runtime",
        description="Leyline inference runtime: sessions whose history is edited by directives.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
