"""mypy is clean on the typed libraries: ``leyline_sdk`` and the LangChain adapter.

Configuration: ``[tool.mypy]`` in pyproject.toml (``make typecheck`` runs the same).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mypy_errors() -> list[str]:
    result = subprocess.run([sys.executable, "-m", "mypy", "-p", "leyline_sdk", "-p", "leyline_langchain"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    return [line for line in result.stdout.splitlines() if re.match(r"^[\w/.-]+\.py:\d+: error:", line)]


def test_mypy_clean_on_the_sdk_and_the_langchain_adapter(mypy_errors):
    assert mypy_errors == []
