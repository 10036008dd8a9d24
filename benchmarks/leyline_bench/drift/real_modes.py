"""One real edit under every mode, on a transformers model: each mode's cache rows, then what the model says.

The rows come from :mod:`.drift_oracle` (the model's per-layer cache spliced as the connectors splice
it): ``exact`` is a fresh prefill of the edited history (the reference); ``forget`` keeps the rows
before the edit and prefills the rest; ``amortize`` keeps them, prefills the replacement and moves the
rows after it by δ (the rotary dims of every key rotated by δ, the rest copied); ``repair-W`` is
amortize with the first W rows after the replacement recomputed exactly (they see only exact rows);
``auto`` is the runtime's rule (:mod:`leyline_runtime.auto_rule`) on the model's measured layer-1
signal, with its default thresholds. Three more corrections of amortize's rows, and the floor:

* ``dependent-N`` recomputes from the edit through the end of the N-th assistant turn after it (the
  turn that read the edited span and wrote its conclusions into the rows after it), rotates the rest;
  with fewer than N turns after the edit it recomputes the whole tail, i.e. it is forget;
* ``tail-K`` recomputes the last K rows of the history (on amortize's rows before them), the cheap
  baseline that reaches what the model attends to most but not what the edit changed;
* ``chunked-C`` is an exact prefill of the edited history in C-token chunks, each over the rows of the
  ones before: exact arithmetic in other matrix shapes, so how far it parts from ``exact`` is the
  dtype's floor (two exact prefills; a second one-shot prefill on the CPU repeats the first bit for bit).

Every mode's rows have the same length (the edited history's), so what follows is one batch, arm 0
the reference: the next turn and an assistant header are prefilled (their logits scored against the
reference's) and greedy tokens decoded; a question is asked likewise on the rows right after the edit.
Batching puts every arm through the same products, so the arms differ only by their rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leyline_runtime.auto_rule import AutoConfig
from .drift_oracle import OraclePolicyRun, Rows, apply_edit, cat, length, prefill, take

EXACT = "exact"


def mode_names(windows: list[int]) -> list[str]:
    return ["amortize", *[f"repair-{w}" for w in windows], "auto", "forget"]


@dataclass
class ModeRows:
    rows: Rows
    recomputed: int  # rows the mode computed through every layer
    signal_tokens: int = 0  # auto: rows of its layer-1 signal
    choice: str | None = None  # auto: what the rule chose
    signal: float | None = None  # auto: the edit's drift (layer-1 change x (layers - 1))


def edited_rows(model, old_rows: Rows, new: list[int], edit, slot, cfg: AutoConfig,
                modes: list[str], turn_ends: list[int] | None = None) -> dict[str, ModeRows]:
    """The rows of the edited history ``new`` under each of ``modes`` (from the old history's ``old_rows``),
    the reference first. ``turn_ends``: where the assistant turns after the edit end in ``new`` (token
    positions, in order; the ``dependent-N`` modes need them)."""
    out = {EXACT: ModeRows(prefill(model, new, 0, [], keep=1)[1], len(new))}
    derived = ("repair-", "dependent-", "tail-", "chunked-")
    needed = {m for m in modes if not m.startswith(derived)}
    needed |= {"amortize"} if any(m.startswith(derived[:3]) for m in modes) else set()
    for policy in ("amortize", "forget", "auto"):
        if policy in needed:
            run = OraclePolicyRun(policy, rows=old_rows)
            apply_edit(model, run, new, edit, slot, cfg)
            out[policy] = ModeRows(run.rows, run.recomputed, run.signal_tokens,
                                   next(iter(run.choices), None), run.signals[0] if run.signals else None)
    n = len(new)
    for m in modes:
        size = int(m.rsplit("-", 1)[1]) if m.startswith(derived) else 0
        if m.startswith("repair-"):
            out[m] = repaired(model, out["amortize"], new, edit.new_end, size)
        elif m.startswith("dependent-"):
            if turn_ends is None:
                raise ValueError(f"{m} needs the ends of the assistant turns after the edit")
            end = turn_ends[size - 1] if len(turn_ends) >= size else n
            out[m] = repaired(model, out["amortize"], new, edit.new_end, end - edit.new_end)
        elif m.startswith("tail-"):
            start = max(edit.new_end, n - size)
            out[m] = repaired(model, out["amortize"], new, start, n - start)
        elif m.startswith("chunked-"):
            out[m] = ModeRows(chunked_prefill(model, new, size), n)
    return {m: out[m] for m in [EXACT, *modes]}


def repaired(model, amortized: ModeRows, new: list[int], start: int, window: int) -> ModeRows:
    """``amortized`` with the rows ``[start, start + window)`` recomputed on its rows before them (exact ones
    where ``start`` is the edit's end: repair, dependent; stale ones for tail)."""
    end = min(len(new), start + window)
    if end <= start:
        return amortized
    rows = amortized.rows
    _, fresh = prefill(model, new[start:end], start, take(rows, 0, start), keep=1)
    return ModeRows(cat(take(rows, 0, start), fresh, take(rows, end, length(rows))), amortized.recomputed + end - start)


def chunked_prefill(model, ids: list[int], chunk: int) -> Rows:
    """The rows of ``ids`` prefilled ``chunk`` tokens at a time, each chunk over the rows before it."""
    rows: Rows = []
    for a in range(0, len(ids), chunk):
        rows = cat(rows, prefill(model, ids[a:a + chunk], a, rows, keep=1)[1])
    return rows


@torch.no_grad()
def continue_all(model, arms: list[Rows], prompt: list[int], steps: int, stop: set[int],
                 keep: int = 0) -> tuple[torch.Tensor | None, list[list[int]]]:
    """Prefill ``prompt`` after each arm's rows (one batch), then decode up to ``steps`` greedy tokens per arm.

    Returns the logits of the prompt's last ``keep`` positions per arm (``[arms, keep, vocab]``, None for 0)
    and each arm's tokens, cut after its first token in ``stop`` (decoding ends when every arm stopped)."""
    from transformers import DynamicCache

    start, batch = length(arms[0]), len(arms)
    cache = DynamicCache(config=model.config)
    for i in range(len(arms[0])):
        cache.update(torch.stack([a[i][0] for a in arms]), torch.stack([a[i][1] for a in arms]), i)
    positions = torch.arange(start, start + len(prompt))[None].expand(batch, -1)
    out = model(input_ids=torch.tensor([prompt] * batch), position_ids=positions, cache=cache, use_cache=True,
                logits_to_keep=max(keep, 1))
    logits = out.logits if keep else None
    nxt = out.logits[:, -1].argmax(-1)
    tokens = [[int(t)] for t in nxt]
    done = [t[0] in stop for t in tokens]
    for step in range(1, steps):
        if all(done):
            break
        position = torch.full((batch, 1), start + len(prompt) + step - 1)
        nxt = model(input_ids=nxt[:, None], position_ids=position, cache=cache, use_cache=True).logits[:, -1].argmax(-1)
        for k, t in enumerate(nxt.tolist()):
            if not done[k]:
                tokens[k].append(t)
                done[k] = t in stop
    return logits, tokens


def agreeing_prefix(reference: list[int], tokens: list[int], stop: set[int]) -> tuple[int, int]:
    """(tokens equal to the reference's before the first difference, tokens compared): the reference's
    tokens up to and including its first stop token."""
    compared = next((k + 1 for k, t in enumerate(reference) if t in stop), len(reference))
    same = next((k for k in range(compared) if k >= len(tokens) or tokens[k] != reference[k]), compared)
    return same, compared


@torch.no_grad()
def answer_logprob(model, arms: list[Rows], prompt: list[int], answer: list[int]) -> list[float]:
    """Per arm, the log-probability (nats) of ``answer`` right after ``prompt``, teacher-forced: a graded
    measure of what the arm's rows still hold, where greedy replies only say yes or no."""
    logits, _ = continue_all(model, arms, prompt + answer, 1, set(), keep=len(answer) + 1)
    logp = torch.log_softmax(logits[:, :len(answer)].float(), -1)
    picked = logp.gather(-1, torch.tensor(answer)[None, :, None].expand(len(arms), -1, 1))
    return picked.sum(dim=(1, 2)).tolist()
