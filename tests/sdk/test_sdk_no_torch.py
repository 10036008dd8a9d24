"""The SDK is the light install: importing and using it never pulls in torch or the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LIGHT_DEPENDENCIES = {
    "leyline_sdk",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_extensions",
    "typing_inspection",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "certifi",
    "idna",
}


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_does_not_load_torch() -> None:
    run_python("import leyline_sdk, sys; assert 'torch' not in sys.modules")


def test_import_adds_nothing_beyond_pydantic_and_httpx() -> None:
    out = run_python(
        """
        import json, sys
        import pydantic, httpx  # the light dependencies, with whatever they load themselves
        before = set(sys.modules)
        import leyline_sdk
        added = {name.split(".")[0] for name in set(sys.modules) - before}
        print(json.dumps(sorted(added)))
        """
    )
    added = set(json.loads(out))
    assert "leyline_sdk" in added
    # pydantic and httpx import parts of themselves (and their own dependencies) lazily.
    allowed = set(sys.stdlib_module_names) | LIGHT_DEPENDENCIES
    assert {
        name for name in added if name not in allowed and not name.startswith("_sysconfigdata")
    } == set()


def test_sdk_works_when_heavy_packages_cannot_be_imported() -> None:
    run_python(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"torch", "triton", "numpy", "fastapi", "leyline_runtime", "leyline_kernels", "leyline_langchain", "leyline_vllm"}:
                    raise ImportError(f"{name} is blocked in this test")
                return None

        sys.meta_path.insert(0, Block())
        import httpx
        from leyline_sdk import LeylineClient, Message, split_append, apply_directives

        old = [Message(role="user", content="a"), Message(role="assistant", content="b")]
        new = [Message(role="user", content="a2"), *old[1:], Message(role="user", content="c")]
        edits, tail = split_append(old, new)
        assert apply_directives(old, edits) + tail == new
        handler = lambda request: httpx.Response(200, json={"status": "ok"})
        with LeylineClient(transport=httpx.MockTransport(handler)) as client:
            assert client.health() == {"status": "ok"}
        """
    )
