"""``pip install ./sdk`` from a checkout: the SDK-only distribution builds from its own folder.

The checkout's two folders it reads (``sdk/`` and ``leyline_sdk/``) are copied
to a temporary folder first, so setuptools' scratch files never land in the
working tree. The wheel test builds with this interpreter's setuptools (no
index, seconds); the install test is ``pip install ./sdk`` as a user types it,
in a throwaway venv (needs an index for the isolated build: slow).
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from installs import ok, python, run, venv

from leyline_sdk.version import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """The part of a checkout that ``pip install ./sdk`` reads, laid out as in the repository."""
    tree = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for folder in ("sdk", "leyline_sdk"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=ignore)
    return tree


def test_the_sdk_folder_builds_a_wheel_of_leyline_sdk_alone(checkout: Path, tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
            "./sdk"], cwd=checkout))
    (wheel,) = out.glob("leyline_kv_sdk-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    sources = {f"leyline_sdk/{p.relative_to(checkout / 'leyline_sdk')}" for p in (checkout / "leyline_sdk").rglob("*")
               if p.is_file()}
    assert {n for n in names if not n.split("/")[0].endswith(".dist-info")} == sources
    # setuptools' metadata scratch stays inside sdk/ (setup.cfg), not beside the package
    assert not list(checkout.glob("*.egg-info"))


@pytest.mark.slow
def test_pip_install_dot_sdk_installs_a_working_sdk(checkout: Path, tmp_path: Path) -> None:
    py = venv(tmp_path / "venv")
    ok(run([str(py), "-m", "pip", "install", "-q", "./sdk"], cwd=checkout))
    report = json.loads(python(py, """
        import importlib.metadata as md, importlib.util, json
        import leyline_sdk
        from leyline_sdk import ConflictError, LeylineClient
        print(json.dumps({"file": leyline_sdk.__file__, "version": md.version("leyline-kv-sdk"),
                          "runtime": importlib.util.find_spec("leyline_runtime") is not None}))
        """))
    assert report["file"].startswith(str(tmp_path / "venv"))
    assert report["version"] == __version__
    assert report["runtime"] is False
