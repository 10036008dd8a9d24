"""Build both wheels: ``leyline-kv`` (everything) and ``leyline-kv-sdk`` (``leyline_sdk`` alone).

    python sdk/build.py [--out dist]

The SDK wheel is built from a staged folder: this folder's ``pyproject.toml``
and ``README.md`` beside a copy of ``leyline_sdk/``, so nothing else of the
repository can end up in it. Uses ``pip wheel`` with the running
interpreter's setuptools when it has one (offline), else pip's isolated build.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
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


def stage_sdk(stage: Path) -> Path:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(SDK_DIR / name, stage / name)
    shutil.copytree(ROOT / "leyline_sdk", stage / "leyline_sdk", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return stage


def build(out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("leyline_kv-*.whl"), *out.glob("leyline_kv_sdk-*.whl")]:
        old.unlink()
    full = pip_wheel(ROOT, out)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' scratch copy of the packages
    with tempfile.TemporaryDirectory(prefix="leyline-sdk-") as tmp:
        sdk = pip_wheel(stage_sdk(Path(tmp)), out)
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
