"""The command lines start light and fail early and clearly.

* ``--help`` of every ``leyline-runtime`` command, and ``leyline-bench --help``, import neither torch nor FastAPI
  (checked by what the process imported, not by wall time);
* without an extra, commands and imports name the extra to install, in one line;
* ``serve`` reports a bad ``--model`` or a busy port before it loads anything heavy.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "numpy", "fastapi", "uvicorn", "safetensors", "tokenizers", "transformers",
         "matplotlib", "leyline_kernels", "leyline_training.train", "leyline_training.evaluate")

# Makes the named top-level modules unimportable, as in an install without the extra.
BLOCK = """
import sys

class Block:
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError("No module named " + repr(name), name=name)
        return None

sys.meta_path.insert(0, Block(BLOCKED))
"""


def python(code: str, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    prefix = f"BLOCKED = {list(blocked)!r}\n{BLOCK}" if blocked else ""
    return subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def run_cli(module: str, argv: list[str], blocked: tuple[str, ...] = ()) -> tuple[int, str, str, list[str]]:
    """Run ``module.main(argv)``; exit code, stdout, stderr, and the heavy modules it imported."""
    result = python(f"""
        import json, sys
        from {module} import main
        try:
            code = main({argv!r})
        except SystemExit as exc:
            code = exc.code
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print("\\n" + json.dumps({{"code": code, "heavy": heavy}}))
        """, blocked)
    assert result.returncode == 0, result.stderr
    out, _, last = result.stdout.rstrip("\n").rpartition("\n")
    report = json.loads(last)
    return report["code"], out, result.stderr, report["heavy"]


@pytest.mark.parametrize(("module", "program", "argv"), [
    ("leyline_runtime.cli", "leyline-runtime", ["--help"]),
    ("leyline_runtime.cli", "leyline-runtime", ["serve", "--help"]),
    ("leyline_training.__main__", "leyline-train", ["--help"]),
    ("leyline_training.__main__", "leyline-train", ["train", "--help"]),
    ("leyline_training.__main__", "leyline-train", ["evaluate", "--help"]),
])
def test_help_imports_nothing_heavy(module, program, argv):
    code, out, _, heavy = run_cli(module, argv)
    assert code == 0 and f"usage: {program}" in out
    assert heavy == []


def test_bench_help_imports_nothing_heavy():
    code, out, _, heavy = run_cli("leyline_bench.cli", ["--help"])
    assert code == 0 and "usage: leyline-bench" in out and "replay" in out
    assert heavy == []
    assert "``" not in out


def test_the_runtime_command_line_has_no_training_commands():
    code, _, err, _ = run_cli("leyline_runtime.cli", ["train", "--help"])
    assert code == 2 and "invalid choice: 'train'" in err


def test_help_works_without_the_runtime_extra():
    code, out, _, _ = run_cli("leyline_runtime.cli", ["serve", "--help"], blocked=("torch", "fastapi", "uvicorn"))
    assert code == 0 and "--model" in out


def test_every_command_spells_dtype_the_same_way():
    # One process for every parser: importing the bench subcommands (torch, transformers) is the slow part.
    result = python("""
        import argparse, json
        from leyline_bench.cli import build_parser as bench
        from leyline_runtime.cli import build_parser as runtime
        from leyline_training.__main__ import build_parser as training

        def helps(parser):
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            return {name: p.format_help() for name, p in sub.choices.items()}

        def flags_without_help(parser):
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            return [f"{name} {a.option_strings[0]}" for name, p in sub.choices.items()
                    for a in p._actions if a.option_strings and not a.help]

        assert not flags_without_help(bench()), flags_without_help(bench())

        print(json.dumps({"runtime": helps(runtime()), "bench": helps(bench()), "train": helps(training())}))
        """)
    assert result.returncode == 0, result.stderr
    helps = json.loads(result.stdout)
    assert "--dtype {float32,bfloat16}" in helps["runtime"]["serve"]
    assert "--dtype {auto,float32,bfloat16}" in helps["train"]["train"]
    assert "--dtype {float32,bfloat16}" in helps["bench"]["kernel"]
    for name, text in helps["bench"].items():
        assert "``" not in text, name
    for name, text in [*helps["runtime"].items(), *helps["bench"].items(), *helps["train"].items()]:
        spellings = set(re.findall(r"--dtype \{([^}]*)\}", text))
        assert spellings <= {"float32,bfloat16", "auto,float32,bfloat16"}, name


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(("module", "argv", "extra"), [
    ("leyline_runtime.cli", ["serve"], "runtime"),
    ("leyline_training.__main__", ["evaluate", "--tasks", "1"], "runtime"),
    ("leyline_bench.cli", ["edit", "--quick"], "runtime"),
])
def test_a_command_without_its_extra_says_what_to_install(module, argv, extra):
    code, _, err, _ = run_cli(module, argv, blocked=("torch",))
    assert code == 1
    line = one_line(err)
    assert f"pip install -e '.[{extra}]'" in line and "torch" in line


@pytest.mark.parametrize("statement", [
    "from leyline_runtime import load_model",
    "from leyline_runtime import Runtime",
    "import leyline_runtime.server",
    "import leyline_kernels",
])
def test_an_import_without_the_extra_names_it(statement):
    result = python(statement, blocked=("torch",))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "needs the 'runtime' extra" in last and "pip install -e '.[runtime]'" in last


def test_a_bad_model_folder_fails_before_loading_anything(tmp_path):
    for folder, why in [(tmp_path / "missing", "no such folder"), (tmp_path, "no config.json")]:
        code, _, err, heavy = run_cli("leyline_runtime.cli", ["serve", "--model", str(folder), "--port", "0"])
        assert code == 2
        assert why in one_line(err) and str(folder) in err
        assert "torch" not in heavy
    (tmp_path / "config.json").write_text("{}")
    code, _, err, _ = run_cli("leyline_runtime.cli", ["serve", "--model", str(tmp_path), "--port", "0"])
    assert code == 2 and "no model.safetensors" in one_line(err)


def test_a_busy_port_fails_before_loading_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err, heavy = run_cli("leyline_runtime.cli", ["serve", "--port", str(port)])
    assert code == 2 and f"127.0.0.1:{port}" in one_line(err) and "--port" in err
    assert "torch" not in heavy
