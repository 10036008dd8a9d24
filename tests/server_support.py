"""Shared helpers for the server tests (no tests here).

The default model and tokenizer load once per process; each test module
builds its own cheap Runtime around them (only the cache pool is new).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from prometheus_client.parser import text_string_to_metric_families

from leyline_runtime.model import load_model
from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_runtime.runtime import Runtime, RuntimeConfig
from leyline_runtime.text.tokenizer import ChatTokenizer


@functools.cache
def default_model_and_tokenizer():
    return load_model(None), ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")


def make_runtime(**config: Any) -> Runtime:
    model, tokenizer = default_model_and_tokenizer()
    config.setdefault("max_cache_tokens", 16384)
    return Runtime(RuntimeConfig(**config), model=model, tokenizer=tokenizer)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """The machine is small and shared: one intra-op thread avoids oversubscription."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def sse_events(body: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded except ``[DONE]``."""
    events = []
    for line in body.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def history(n: int, words: int = 12) -> list[dict[str, str]]:
    """A system message plus ``n`` alternating user/assistant messages of ``words`` words."""
    msgs = [{"role": "system", "content": "You are a terse assistant."}]
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": " ".join(f"w{i}_{k}" for k in range(words))})
    return msgs
