"""``make gpu-wheels``: the wheels a GPU machine's image lacks, fetched here for ``make gpu-check``.

The GPU machine sometimes lent to this work (an H200: Python 3.12, torch, Triton, transformers,
numpy, tokenizers, safetensors, httpx, prometheus-client, uvicorn's h11/click and starlette's anyio)
reaches no registry and has no pydantic, llguidance, FastAPI, Starlette, uvicorn or orjson, which
the bundled runtime imports. This module downloads them, for that machine's Python and platform, into
an ignored folder that travels with the checkout (``.gpu-wheels``, well under the 64 MiB a device
call may carry); ``benchmarks/gpu_check.sh`` installs them there into a throwaway target folder.

Each package is pinned to the version installed beside this interpreter (the one ``make test``
runs the runtime with here), so the GPU runs the code the CPU suite tested. The folder is emptied
first: two versions of one package would stop the install there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..common.machine import REPO_ROOT

# What the runtime imports (leyline_runtime, leyline_sdk) and the image lacks, with their own
# requirements the image lacks too (typing-extensions: pydantic wants a newer one than the image's;
# annotated-doc and opentelemetry-api: FastAPI's).
PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
            "llguidance", "fastapi", "starlette", "annotated-doc", "opentelemetry-api", "uvicorn", "orjson")
# Requirements of those that the GPU image brings (its package list: the device tool's KINDS.md).
IMAGE_HAS = ("anyio", "click", "h11", "importlib-metadata")
# The GPU image's Python and platform (pip matches manylinux tags exactly: name every one we accept).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
DEFAULT_DEST = REPO_ROOT / ".gpu-wheels"


def pinned() -> list[str]:
    """``name==version`` of every package, at the version installed here (a missing one is an error)."""
    pins = []
    for name in PACKAGES:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"gpu-wheels: {name} is not installed here; run make install first") from None
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uncovered_requirements() -> list[str]:
    """Requirements of the carried packages (as installed here, markers read for the GPU's Python)
    that neither travel nor come with the image: each one would fail an import there."""
    from packaging.requirements import Requirement

    covered = {_canonical(n) for n in PACKAGES + IMAGE_HAS}
    env = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    missing = []
    for name in PACKAGES:
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if (req.marker is None or req.marker.evaluate(env)) and _canonical(req.name) not in covered:
                missing.append(f"{name} needs {req}")
    return missing


def download_command(pins: list[str], dest: Path) -> list[str]:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms, "-d", str(dest), *pins]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m leyline_bench.gpu.wheels", description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"wheel folder (default {DEFAULT_DEST})")
    args = p.parse_args(argv)
    pins = pinned()
    missing = uncovered_requirements()
    if missing:
        print("gpu-wheels: add to PACKAGES or IMAGE_HAS: " + "; ".join(missing), file=sys.stderr)
        return 1
    shutil.rmtree(args.dest, ignore_errors=True)
    args.dest.mkdir(parents=True)
    proc = subprocess.run(download_command(pins, args.dest))
    if proc.returncode != 0:
        print(f"gpu-wheels: pip download failed (exit {proc.returncode}) for {' '.join(pins)}", file=sys.stderr)
        return proc.returncode
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"gpu-wheels: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
