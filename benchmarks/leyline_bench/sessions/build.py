"""Build ``benchmarks/data/mini_swe_agent/sessions.jsonl.gz`` from a git snapshot of the source.

    python -m leyline_bench.sessions.build --git-dir PATH/TO/mini-swe-agent.git [--commit C]
        [--heldout 100] [--calibration 10] [--out benchmarks/data/mini_swe_agent/sessions.jsonl.gz]

Run once, by hand, where a snapshot of gruckion/mini-swe-agent is at hand; the bench only
reads the result (``load.py``). The selection rule: every ``<id>/<id>.traj.json`` under
:data:`TRAJECTORY_DIR` at the commit, each split (``split.py``) sorted by the SHA-1 hex digest
of the instance id, and the first N of each, skipping none: a trajectory that does not
convert stops the build. The file is gzip with no name and mtime 0, so the same input gives
the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

from leyline_sdk.protocol import Message

from .convert import convert_trajectory, last_call_prompt_tokens
from .split import SPLITS, sha1_of, split_of

SOURCE_REPO = "gruckion/mini-swe-agent"
TRAJECTORY_DIR = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "mini_swe_agent" / "sessions.jsonl.gz"


def _git(git_dir: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], input=stdin, capture_output=True,
                          check=True).stdout


def trajectory_paths(git_dir: Path, commit: str) -> list[str]:
    names = _git(git_dir, "ls-tree", "-r", "--name-only", commit, TRAJECTORY_DIR + "/").decode().splitlines()
    return sorted(n for n in names if n.endswith(".traj.json")
                  and Path(n).parent.name + ".traj.json" == Path(n).name)


def read_blobs(git_dir: Path, commit: str, paths: list[str]) -> dict[str, bytes]:
    """Every path's bytes at ``commit``, through one ``git cat-file --batch``."""
    raw = _git(git_dir, "cat-file", "--batch", stdin="".join(f"{commit}:{p}\n" for p in paths).encode())
    blobs, at = {}, 0
    for path in paths:
        header_end = raw.index(b"\n", at)
        header = raw[at:header_end].decode()
        if header.endswith("missing"):
            raise FileNotFoundError(f"{path} is not in the snapshot at {commit}")
        size = int(header.rsplit(" ", 1)[1])
        blobs[path] = raw[header_end + 1:header_end + 1 + size]
        at = header_end + 1 + size + 1  # the blob, then a newline
    return blobs


def session_record(trajectory: dict[str, Any], path: str, commit: str) -> dict[str, Any]:
    instance_id = trajectory["instance_id"]
    if Path(path).parent.name != instance_id:
        raise ValueError(f"{path} holds instance {instance_id!r}")
    messages = convert_trajectory(trajectory)
    for message in messages:
        Message.model_validate(message)
    return {"instance_id": instance_id, "split": split_of(instance_id), "sha1": sha1_of(instance_id),
            "source_path": path, "source_commit": commit, "n_messages": len(messages),
            "last_call_prompt_tokens": last_call_prompt_tokens(trajectory), "messages": messages}


def select(paths: list[str], counts: dict[str, int]) -> list[str]:
    """The first ``counts[split]`` paths of each split by the SHA-1 of their instance id."""
    by_split: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
    for path in paths:
        instance_id = Path(path).parent.name
        by_split[split_of(instance_id)].append((sha1_of(instance_id), path))
    chosen = []
    for split in SPLITS:
        ranked = sorted(by_split[split])
        if len(ranked) < counts[split]:
            raise ValueError(f"{split}: {counts[split]} asked for, {len(ranked)} in the source")
        chosen += [path for _, path in ranked[:counts[split]]]
    return chosen


def write_sessions(records: list[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        for record in records:
            gz.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", type=Path, required=True, help="a clone (bare or not) of " + SOURCE_REPO)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--heldout", type=int, default=100)
    parser.add_argument("--calibration", type=int, default=10)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    commit = _git(args.git_dir, "rev-parse", args.commit + "^{commit}").decode().strip()
    paths = trajectory_paths(args.git_dir, commit)
    chosen = select(paths, {"heldout": args.heldout, "calibration": args.calibration})
    blobs = read_blobs(args.git_dir, commit, chosen)
    records = [session_record(json.loads(blobs[path]), path, commit) for path in chosen]
    write_sessions(records, args.out)
    print(f"{len(records)} of {len(paths)} sessions from {SOURCE_REPO}@{commit} -> {args.out} "
          f"({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
