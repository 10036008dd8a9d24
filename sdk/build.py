"""Build both wheels: ``leyline-kv`` (the product: SDK, runtime, kernels, integrations; no benches or
training) and ``leyline-kv-sdk`` (``leyline_sdk`` alone).

    python sdk/build.py [--out dist]

The SDK wheel is built from this folder as ``pip install ./sdk`` builds it (its
``pyproject.toml`` names ``leyline_sdk`` alone, read from the repository root).
Uses ``pip wheel`` with the running interpreter's setuptools when it has one
(offline), else pip's isolated build.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

SDK_DIR = Path(__file__).resolve().parent
ROOT = SDK_DIR.parent


def pip_wheel(source: Path, out: Path) -> Path:
    before = set(out.glob("*.whl"))
    isolation = ["--no-build-isolation"] if _setuptools_builds_wheels() else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(out), str(source)],
                   check=True)
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def _setuptools_builds_wheels() -> bool:
    """setuptools >= 77: builds wheels by itself and reads the SPDX ``license`` string."""
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (77, 0)


def build(out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("leyline_kv-*.whl"), *out.glob("leyline_kv_sdk-*.whl")]:
        old.unlink()
    full = pip_wheel(ROOT, out)
    sdk = pip_wheel(SDK_DIR, out)
    # setuptools' scratch copies of the packages, and the SDK's metadata scratch folder (setup.cfg)
    for scratch in (ROOT / "build", SDK_DIR / "build", *SDK_DIR.glob("*.egg-info")):
        shutil.rmtree(scratch, ignore_errors=True)
    return full, sdk


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python sdk/build.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dist"), help="folder for the wheels (default: dist/)")
    args = ap.parse_args(argv)
    for wheel in build(Path(args.out)):
        print(f"{wheel}  {wheel.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
