"""README.md's Python runs as written, against the runtime its quick start starts, and prints what it shows.

The server is started as the README starts it (``make serve ARGS="..."``: its ARGS, on a free port, with
one torch thread as ``make docs`` runs the README's commands, so greedy outputs repeat), and every
snippet runs as a reader runs it: a separate ``python`` process, from the checkout's root, with only the
environment the README's ``export`` line sets (its URL's port replaced by the test server's).

How the README's fenced blocks are read (a new kind of block fails here until it is given a role):

* ```` ```python ```` -- runs, and must exit 0. A block that is not meant to run (a fragment, a
  config file shown as Python) is preceded by the line ``<!-- not run: why -->``.
* ```` ```text ```` right after a ``python`` block (prose between them is fine, another fence is not)
  -- what that block prints: its stdout must equal it.
* ```` ```console ```` -- ``$ command`` lines with their outputs; ``make docs`` runs and regenerates
  them (``leyline_bench.serve.docs``; ``tests/repo/test_docs.py`` checks them), so they are not run here.
* any other fence -- needs ``<!-- not run: why -->``; shell lines for the reader go in indented blocks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from served_runtime import serving

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!-- not run: \S.*-->\n\Z")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
SNIPPET_TIMEOUT_S = 300


@dataclass(frozen=True)
class Snippet:
    line: int  # where its fence opens in README.md (1-based), for the failure message
    code: str
    expected_stdout: str | None  # None: the README shows no output for it


def readme_snippets(text: str) -> list[Snippet]:
    """The README's runnable Python blocks with the outputs it shows for them (see the module docstring)."""
    snippets: list[Snippet] = []
    previous: str | None = None  # the language of the fence before this one
    for fence in FENCE.finditer(text):
        language, body = fence[1], fence[2]
        line = text.count("\n", 0, fence.start()) + 1
        marked = bool(NOT_RUN.search(text[:fence.start()]))
        if marked:
            pass
        elif language == "python":
            snippets.append(Snippet(line, body, None))
        elif language == "text" and previous == "python" and snippets and snippets[-1].expected_stdout is None:
            snippets[-1] = Snippet(snippets[-1].line, snippets[-1].code, body)
        elif language != "console":
            raise AssertionError(f"README.md:{line}: a ```{language} block with no role: make it python, the "
                                 "text output right after a python block, console, or mark it <!-- not run: why -->")
        previous = None if marked else language
    return snippets


def readme_server_args(text: str) -> list[str]:
    """The flags of the README's ``make serve ARGS="..."`` line."""
    found = re.search(r'^\s*make serve ARGS="([^"]*)"\s*$', text, re.M)
    assert found, "the README's quick start starts the runtime with make serve ARGS=\"...\""
    return shlex.split(found[1])


def readme_environment(text: str, base_url: str) -> dict[str, str]:
    """The variables of the README's ``export`` line, LEYLINE_BASE_URL pointed at ``base_url``."""
    found = re.search(r"^\s*export (LEYLINE_\w+=\S+(?: LEYLINE_\w+=\S+)*)\s*$", text, re.M)
    assert found, "the README's quick start exports LEYLINE_BASE_URL and LEYLINE_API_KEY"
    exported = dict(pair.split("=", 1) for pair in found[1].split())
    assert urlsplit(exported["LEYLINE_BASE_URL"]).hostname == "127.0.0.1", exported
    return {**exported, "LEYLINE_BASE_URL": base_url}


def test_the_blocks_are_read_by_their_roles():
    text = ("```console\n$ curl x\nout\n```\n```python\nprint(1)\n```\nIt prints:\n\n```text\n1\n```\n"
            "<!-- not run: a fragment -->\n```python\nagent = ...\n```\n```python\nx = 2\n```\n")
    snippets = readme_snippets(text)
    assert [(s.code, s.expected_stdout) for s in snippets] == [("print(1)\n", "1\n"), ("x = 2\n", None)]
    for orphan in ("```text\n1\n```\n",  # after no python block
                   "```python\nprint(1)\n```\n```text\n1\n```\n```text\n1\n```\n",  # a second output
                   "<!-- not run: a fragment -->\n```python\nx = 1\n```\n```text\n1\n```\n",  # of a block not run
                   "```yaml\na: 1\n```\n"):
        with pytest.raises(AssertionError, match=r"block with no role"):
            readme_snippets(orphan)
    assert readme_snippets("<!-- not run: a config file -->\n```yaml\na: 1\n```\n") == []


def test_the_readme_installs_langchain_from_the_checkout_as_the_import_error_says():
    """`make serve`'s .venv has no LangChain: the README's line adds it, and importing the adapter without
    it names that same line. Nothing is installed from a package index by a name it does not hold."""
    text = README.read_text()
    line = re.search(r"^ {4}(\.venv/bin/pip install -e '\.\[(\w+)\]')$", text, re.M)
    assert line and line[2] == "langchain", "the README adds LangChain to make serve's .venv"
    assert "langchain" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not re.search(r"pip install [^\n`]*leyline-kv", text), "leyline-kv is on no package index"
    without_langchain = (
        "import sys\n"
        "class NoLangChain:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('langchain', 'langchain_core'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoLangChain())\n"
        "import leyline_langchain\n")
    run = subprocess.run([sys.executable, "-c", without_langchain], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "needs LangChain (langchain is missing)" in run.stderr, run.stderr[-2000:]
    assert line[1] in run.stderr


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory) -> Iterator[str]:
    """``make serve ARGS="<the README's>"``'s command, on a free port."""
    args = [*readme_server_args(README.read_text()), "--threads", "1", "--log-level", "warning"]
    with serving(args, tmp_path_factory.mktemp("readme-serve") / "serve.log") as url:
        yield url


SNIPPETS = readme_snippets(README.read_text())


def test_the_readme_has_python_to_run():
    assert SNIPPETS, "README.md has no python block to run"
    assert any(s.expected_stdout is not None for s in SNIPPETS), "README.md shows no output to check"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"README.md:{s.line}")
def test_the_readme_snippet_runs_as_written(snippet: Snippet, readme_server: str, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEYLINE_")}  # only what the README sets
    env.update(readme_environment(README.read_text(), readme_server))
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=SNIPPET_TIMEOUT_S)
    assert run.returncode == 0, f"README.md:{snippet.line} exited {run.returncode}:\n{run.stderr[-3000:]}"
    if snippet.expected_stdout is not None:
        assert run.stdout == snippet.expected_stdout, (
            f"README.md:{snippet.line} printed\n{run.stdout}\nwhere the README shows\n{snippet.expected_stdout}")
