"""Correctness probes on a served ``vllm serve`` + Leyline's plugins, shared by ``tests/vllm`` and
``leyline-bench portability``.

* ``history`` / ``edited`` / ``REPLACEMENT``: the short travel-writer history the checks edit
  (message 3 replaced by ``REPLACEMENT``);
* ``splice_info``: the connector's verdict from ``/healthz`` (spliced with its layout, or refused
  with the reason);
* ``rows`` / ``split_rope`` / ``layer0_errors``: a session's saved rows of one layer (the debug route,
  ``LEYLINE_VLLM_DEBUG_ROUTES=1``), split into the rotary dims of every K row and everything else
  (V and the non-rotary K dims), and the max error of each against a reference, relative to the
  reference's largest value;
* ``amortize_once`` / ``moved_layer0``: one amortized edit, then the moved tokens' layer-0 rows next to
  a fresh prefill's of the edited history;
* ``chat_ids`` / ``fresh_completion``: the reference for forget, vLLM's own ``/v1/completions`` on the
  token ids the checkpoint's chat template renders (transformers; vLLM's chat route renders gpt-oss
  with Harmony instead, so its ids would differ).
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np

from leyline_sdk import LeylineClient
from leyline_sdk.protocol import Directive, Message, Span

from leyline_testkit.vllm_server import SERVED_MODEL_NAME

TOPICS = ["the harbour", "a wool market", "the night train", "an old lighthouse", "the river delta",
          "a mountain pass", "the salt flats", "a paper mill", "the orchard", "a copper mine"]
REPLACEMENT = [Message(role="user", content="Note X: skip that one; tell me about bread instead, briefly.")]
EDITED_INDEX = 3  # the message REPLACEMENT takes the place of


def history(n: int = 8, tag: str | None = None) -> list[Message]:
    """``tag``: a history of the caller's own from its first token on (the tag is in the system message),
    for a check about reuse: with vLLM's prefix cache on, rows another check computed exactly for the
    same text are legitimately reused."""
    notebook = f" (notebook {tag})" if tag else ""
    out = [Message(role="system", content=f"You are a careful travel writer{notebook}. Answer in plain prose.")]
    for i in range(n - 1):
        role = "user" if i % 2 == 0 else "assistant"
        topic = TOPICS[i % len(TOPICS)]
        out.append(Message(role=role, content=(
            f"Note {i}: describe {topic} in the early morning, the people who work there, what they carry, "
            f"the weather over {topic}, and one small thing a visitor would miss. Keep it to one paragraph.")))
    return out


def edited(messages: list[Message], index: int, replacement: list[Message]) -> list[Message]:
    return messages[:index] + replacement + messages[index + 1:]


def edit_directive(mode: str) -> Directive:
    return Directive(span=Span(start=EDITED_INDEX, end=EDITED_INDEX + 1), replacement=REPLACEMENT, mode=mode)


def greedy(client: LeylineClient, session_id: str, max_tokens: int = 6):
    return client.generate(session_id, max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=5)


# -- the connector's verdict and its rows ----------------------------------------------------------

def splice_info(base_url: str) -> dict:
    """``/healthz``'s ``splice``: ``supported`` with the layout (kind, rope class, pairing, rotary_dim,
    rope_offset, rows_per_token, row_width), or ``supported: False`` with the ``reason``."""
    return httpx.get(f"{base_url}/healthz", timeout=30).json()["splice"]


def rows(base_url: str, session_id: str, layer: int, rank: int = 0) -> np.ndarray:
    """One layer of a session's saved rows as tensor-parallel rank ``rank`` holds them (its KV heads)."""
    r = httpx.get(f"{base_url}/leyline/debug/sessions/{session_id}/rows", params={"layer": layer, "rank": rank},
                  timeout=120)
    r.raise_for_status()
    body = r.json()
    return np.frombuffer(base64.b64decode(body["data"]), dtype=np.float32).reshape(body["shape"])


def split_rope(splice: dict, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer rows -> (the rotary dims of every K row, everything else: V and the non-rotary K dims)."""
    per_token = table.reshape(len(table), splice["rows_per_token"], splice["row_width"])
    lo, hi = splice["rope_offset"], splice["rope_offset"] + splice["rotary_dim"]
    rest = np.concatenate([per_token[..., :lo], per_token[..., hi:]], axis=-1)
    return per_token[..., lo:hi], rest


def layer0_errors(splice: dict, got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max |got - want| of the rotary dims and of the other dims, each over the reference's largest value."""
    (got_rot, got_rest), (want_rot, want_rest) = split_rope(splice, got), split_rope(splice, want)
    rotary = float(np.abs(got_rot - want_rot).max() / np.abs(want_rot).max())
    rest = float(np.abs(got_rest - want_rest).max() / np.abs(want_rest).max()) if want_rest.size else 0.0
    return rotary, rest


def amortize_once(client: LeylineClient, session_id: str, old: list[Message] | None = None):
    """Create ``session_id`` on ``old`` (default ``history()``) and amortize the edit; its outcome."""
    client.create_session(history() if old is None else old, session_id=session_id)
    (outcome,) = client.apply(session_id, [edit_directive("amortize")]).outcomes
    return outcome


def moved_layer0(client: LeylineClient, base_url: str, session_id: str, outcome,
                 old: list[Message] | None = None, rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The moved tokens' layer-0 rows of the amortized ``session_id`` and of a fresh prefill of the edited
    history (session ``fresh-<session_id>``)."""
    first = outcome.token_end + outcome.delta
    moved = slice(first, first + outcome.rotated_tokens)
    client.create_session(edited(history() if old is None else old, EDITED_INDEX, REPLACEMENT),
                          session_id=f"fresh-{session_id}")
    fresh = f"fresh-{session_id}"
    return rows(base_url, session_id, 0, rank)[moved], rows(base_url, fresh, 0, rank)[moved]


# -- vLLM's own fresh prefill ----------------------------------------------------------------------

def chat_ids(model: str | Path, messages: list[Message], *, generation_prompt: bool) -> list[int]:
    """The history's token ids as the checkpoint's chat template renders them (transformers)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return list(tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in messages],
                                              add_generation_prompt=generation_prompt, tokenize=True,
                                              return_dict=False))


def fresh_completion(base_url: str, model: str | Path, messages: list[Message], max_tokens: int) -> list[dict]:
    """vLLM's own ``/v1/completions`` (no session, no plugin code) on the history's chat-template ids:
    ``[{"token", "logprob"}]`` of ``max_tokens`` greedy tokens."""
    ids = chat_ids(model, messages, generation_prompt=True)
    body = {"model": SERVED_MODEL_NAME, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 5}
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]
    return [{"token": t, "logprob": v} for t, v in zip(lp["tokens"], lp["token_logprobs"])]
