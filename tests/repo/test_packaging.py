"""What the product ships, and both wheels, built the way ``make dist`` builds them, installed into throwaway venvs.

* ``leyline-kv`` (``pip install .``) packages no bench, training or testkit code: those folders are
  distributions of their own (checked fast, by what setuptools finds, and in the built wheel);
* ``leyline-kv-sdk`` holds ``leyline_sdk`` alone, is < 1 MB, has no console
  scripts, and installs and works where torch is not installed;
* ``leyline-kv`` installs beside Hugging Face's ``kernels`` and PyPI's
  ``integrations`` (the names our folders carry) and all of them import from
  their own files; its console scripts answer without torch, naming the extra.

The wheel tests need pip to reach an index (the local mirror or PyPI) and take a minute or two (marked slow).
"""

from __future__ import annotations

import json
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from installs import ok, python, run, venv
from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"leyline_sdk", "leyline_runtime", "leyline_kernels", "leyline_langchain", "leyline_vllm"}
NOT_THE_PRODUCT = ("leyline_bench", "leyline_training", "leyline_testkit")


def test_the_product_packages_no_bench_training_or_testkit_code():
    # what `pip install .` builds: setuptools expands the root pyproject's package finder as the build does
    found = read_configuration(ROOT / "pyproject.toml", expand=True)["tool"]["setuptools"]["packages"]
    assert {name.split(".")[0] for name in found} == PRODUCT
    # and each of the others is a distribution of its own, with its console script where it has one
    for folder, distribution, script in (("benchmarks", "leyline-bench", "leyline-bench"),
                                         ("training", "leyline-training", "leyline-train"),
                                         ("testkit", "leyline-testkit", None)):
        config = read_configuration(ROOT / folder / "pyproject.toml", expand=True)
        assert config["project"]["name"] == distribution
        assert {name.split(".")[0] for name in config["tool"]["setuptools"]["packages"]} == {
            distribution.replace("-", "_")}
        assert list(config["project"].get("scripts", {})) == ([script] if script else [])


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    ok(run([sys.executable, str(ROOT / "sdk" / "build.py"), "--out", str(out)], cwd=ROOT))
    return {"full": next(out.glob("leyline_kv-*.whl")), "sdk": next(out.glob("leyline_kv_sdk-*.whl"))}


@pytest.mark.slow
def test_sdk_wheel_is_the_sdk_alone(wheels):
    wheel = wheels["sdk"]
    assert wheel.stat().st_size < 1_000_000
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names} == {"leyline_sdk", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert "leyline_sdk/py.typed" in names
    assert not any(n.endswith("entry_points.txt") for n in names)
    requires = sorted(line.split(":", 1)[1].strip().split(">")[0].split("<")[0]
                      for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    assert requires == ["httpx", "pydantic"]


@pytest.mark.slow
def test_full_wheel_has_the_product_alone_and_no_clashing_name(wheels):
    with zipfile.ZipFile(wheels["full"]) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == PRODUCT
    assert not [n for n in names if n.startswith(NOT_THE_PRODUCT)]
    assert "leyline-bench" not in entry_points and "leyline-train" not in entry_points
    for package in tops:
        assert f"{package}/py.typed" in names
    assert "leyline_runtime/default_model/config.json" in names


@pytest.mark.slow
def test_sdk_wheel_installs_and_works_without_torch(wheels, tmp_path):
    py = venv(tmp_path / "sdk-venv")
    ok(run([str(py), "-m", "pip", "install", "-q", str(wheels["sdk"])], cwd=tmp_path))
    out = python(py, """
        import importlib.metadata as md, importlib.util, json
        import httpx
        import leyline_sdk
        from leyline_sdk import LeylineClient, Message, split_append
        edits, tail = split_append([Message(role="user", content="a")], [Message(role="user", content="b")])
        handler = lambda request: httpx.Response(200, json={"status": "ok"})
        with LeylineClient(transport=httpx.MockTransport(handler)) as client:
            health = client.health()
        print(json.dumps({"file": leyline_sdk.__file__, "health": health, "edits": len(edits),
                          "torch": importlib.util.find_spec("torch") is not None,
                          "runtime": importlib.util.find_spec("leyline_runtime") is not None,
                          "scripts": sorted(e.name for e in md.entry_points(group="console_scripts")
                                            if e.name.startswith("leyline"))}))
        """)
    report = json.loads(out)
    assert report["file"].startswith(str(tmp_path / "sdk-venv"))
    assert report == {**report, "health": {"status": "ok"}, "edits": 1, "torch": False, "runtime": False, "scripts": []}


@pytest.mark.slow
def test_full_wheel_installs_beside_kernels_and_integrations(wheels, tmp_path):
    home = tmp_path / "full-venv"
    py = venv(home)
    ok(run([str(py), "-m", "pip", "install", "-q", str(wheels["full"]), "kernels", "cryptography"], cwd=tmp_path))
    # PyPI's `integrations` declares Python >= 3.12 and two dependencies that are not on PyPI;
    # its package itself imports on 3.11 with pydantic and cryptography, which is all we need here.
    ok(run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python", "integrations"], cwd=tmp_path))

    # Without the runtime extra the console script answers in one line that names it; the benches' is not there.
    bin_dir = home / "bin"
    assert "usage: leyline-runtime" in ok(run([str(bin_dir / "leyline-runtime"), "serve", "--help"], cwd=tmp_path))
    result = run([str(bin_dir / "leyline-runtime"), "serve"], cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "pip install -e '.[runtime]'" in result.stderr
    assert not (bin_dir / "leyline-bench").exists() and not (bin_dir / "leyline-train").exists()

    # With torch and the other extras visible (this interpreter's packages, after the venv's own),
    # every package imports, each from its own files.
    site = Path(python(py, "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "zz_test_extras.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = python(py, """
        import json
        import kernels, integrations
        import leyline_sdk, leyline_kernels, leyline_runtime, leyline_langchain
        from leyline_runtime import load_model
        mods = [kernels, integrations, leyline_sdk, leyline_kernels, leyline_runtime, leyline_langchain]
        print(json.dumps({m.__name__: m.__file__ for m in mods}))
        """)
    files = json.loads(out)
    assert all(path.startswith(str(site)) for path in files.values()), files
    assert files["kernels"] == str(site / "kernels" / "__init__.py")
    assert files["integrations"] == str(site / "integrations" / "__init__.py")
