"""README and docs/ stay true to the code.

* The example outputs of every file in ``docs.CHECKED_FILES`` (README.md, docs/api.md) equal a
  fresh run (``python -m leyline_bench.serve.docs``, which starts a real runtime and runs the documents'
  own commands), and no other document holds generated examples.
* The README is a front door: at most 250 lines, the quick start first, its Performance table
  quoted verbatim from docs/performance.md, one short line per target (at most 12, no cell over 160
  characters). Figures quoted in several documents agree: ``test_docs_figures.py``.
* Every ``leyline-runtime`` / ``leyline-bench`` command line in README.md and docs/
  parses with the real CLI parser (flags of synopsis lines exist), and every
  ``make`` target named exists.
* Nothing points outside the repository, and relative links resolve.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from leyline_bench.serve import docs

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Written in other branches at the same time; linked before they land, checked once they exist.
LINKED_AHEAD = {"docs/langgraph.md", "docs/operations.md", "docs/vllm.md"}


@pytest.mark.slow
def test_readme_outputs_equal_a_fresh_run():
    result = subprocess.run([sys.executable, "-m", "leyline_bench.serve.docs"], cwd=ROOT, capture_output=True,
                            text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_the_check_sees_stale_outputs_and_only_those():
    text = "intro\n```console\n$ echo hi\nold\n```\n\n```python\nx = 1\n```\n"
    fresh = docs.regenerate(text, lambda command: {"echo hi": "hi\n"}[command])
    assert fresh == "intro\n```console\n$ echo hi\nhi\n```\n\n```python\nx = 1\n```\n"
    run_a = '{"id":"chatcmpl-0f8a","created":1795977986,"elapsed_ms":8.25}\nx_created{a="b"} 1.79e+09'
    run_b = '{"id":"chatcmpl-77aa","created":1795977999,"elapsed_ms":2.5}\nx_created{a="b"} 1.80e+09'
    assert docs.normalized(run_a) == docs.normalized(run_b)
    assert docs.normalized(run_a) != docs.normalized(run_a.replace("8.25}", "8.25,\"n\":1}"))


def test_examples_in_the_docs_are_the_files():
    included = [found for path in docs.CHECKED_FILES
                for found in re.findall(r"<!-- example: (\S+) -->\n```python\n(.*?)^```$", path.read_text(),
                                        re.S | re.M)]
    assert included
    for path, body in included:
        assert body == (ROOT / path).read_text(), f"the docs' copy of {path} differs: run make docs"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_examples_live_only_in_the_checked_files(document):
    text = document.read_text()
    generated = "```console" in text or "<!-- example:" in text
    assert generated == (document in docs.CHECKED_FILES), f"{document.name}: add it to docs.CHECKED_FILES"


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0].startswith("## Quick start")
    quick_start = lines[lines.index(headings[0]):lines.index(headings[1])]
    for needed in ("make serve", "LEYLINE_BASE_URL", "LEYLINE_API_KEY", "--api-key", "curl", "create_agent",
                   "make test"):
        assert any(needed in line for line in quick_start), needed


def markdown_tables(text: str) -> list[str]:
    return re.findall(r"(?:^\|.*\|\n)+", text, re.M)


def test_the_readme_quotes_the_headline_performance_table():
    readme = (ROOT / "README.md").read_text()
    quoted = markdown_tables(readme.split("## Performance", 1)[1])[0]
    assert quoted in markdown_tables((ROOT / "docs" / "performance.md").read_text())
    # read at a glance: one short line per target; the long measurements stay in docs/performance.md
    header, rule, *rows = quoted.splitlines()
    assert len(rows) <= 12
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3 and max(map(len, cells)) <= 160, f"a README Performance cell is long: {row}"


def command_lines(text: str) -> list[str]:
    """Shell lines of code blocks (fenced or indented) and inline code spans, continuations joined."""
    blocks = re.findall(r"^```(?:console|bash|sh|shell)?\n(.*?)^```$", text, re.S | re.M)
    blocks += re.findall(r"(?:^ {4}.*\n?)+", text, re.M)
    lines = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            lines.append(line.strip().removeprefix("$ "))
    return lines + re.findall(r"`([^`\n]+)`", text)


def cli_parser(program: str) -> argparse.ArgumentParser:
    if program == "leyline-runtime":
        from leyline_runtime.cli import build_parser
    elif program == "leyline-train":
        from leyline_training.__main__ import build_parser
    else:
        from leyline_bench.cli import build_parser
    return build_parser()


def options_of(parser: argparse.ArgumentParser, command: str) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_cli_commands_in_the_docs_parse(document):
    checked = 0
    for line in command_lines(document.read_text()):
        words = line.split()
        if not words or words[0].removeprefix(".venv/bin/") not in {"leyline-runtime", "leyline-bench", "leyline-train"}:
            continue
        program = words[0].removeprefix(".venv/bin/")
        parser = cli_parser(program)
        if "[" in line or len(words) < 3:  # a synopsis or a mention: its flags must exist
            flags = set(re.findall(r"(--[a-z][\w-]*)", line)) - {"--help"}
            if len(words) >= 2 and re.fullmatch(r"[a-z]+", words[1]):
                assert flags <= options_of(parser, words[1]), line
        else:
            try:
                parser.parse_args(shlex.split(line)[1:])
            except SystemExit as exc:  # --help exits 0; a bad flag exits 2
                if exc.code != 0:
                    pytest.fail(f"{document.name}: does not parse: {line}")
        checked += 1
    if document in docs.CHECKED_FILES:
        assert checked >= 1


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_make_targets_named_in_the_docs_exist(document):
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {m for line in command_lines(document.read_text()) for m in re.findall(r"^make ([\w-]+)", line)}
    assert named <= targets


def test_nothing_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = [p for p in tracked.split() if (ROOT / p).is_file() and p.endswith((".md", ".py", ".toml"))
                 and "../shared" in (ROOT / p).read_text(errors="ignore") and p != "tests/repo/test_docs.py"]
    assert offenders == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        path = (document.parent / target).resolve()
        relative = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else target
        assert path.is_relative_to(ROOT), f"{document.name} links outside the repository: {target}"
        assert path.exists() or relative in LINKED_AHEAD, f"{document.name}: broken link {target}"


def test_the_metrics_examples_show_every_series_they_grep_for():
    """A grep over /metrics in the docs names only series its output (a tenant key's view) holds."""
    checked = 0
    for path in docs.CHECKED_FILES:
        for block in re.findall(r"^```console\n(.*?)^```$", path.read_text(), re.S | re.M):
            grep = re.search(r"/metrics .*grep -E '\^leyline_\(([^)]*)\)'", block)
            if grep:
                output = block.split("\n", 1)[1]
                for name in grep[1].split("|"):
                    assert re.search(rf"^leyline_{name}", output, re.M), f"{path.name}: no leyline_{name} series"
                checked += 1
    assert checked

