"""One real edit under every mode, on a transformers model: each mode's cache rows, then what the model says.

The rows come from :mod:`.drift_oracle` (the model's per-layer cache spliced as the connectors splice
it): ``exact`` is a fresh prefill of the edited history (the reference); ``forget`` keeps the rows
before the edit and prefills the rest; ``amortize`` keeps them, prefills the replacement and moves the
rows after it by δ (the rotary dims of every key rotated by δ, the rest copied); ``repair-W`` is
amortize with the first W rows after the replacement recomputed exactly (they see only exact rows);
``auto`` is the runtime's rule (:mod:`leyline_runtime.auto_rule`) on the model's measured layer-1
signal, with its default thresholds.

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
                modes: list[str]) -> dict[str, ModeRows]:
    """The rows of the edited history ``new`` under each of ``modes`` (from the old history's ``old_rows``),
    the reference first."""
    out = {EXACT: ModeRows(prefill(model, new, 0, [], keep=1)[1], len(new))}
    needed = {m for m in modes if not m.startswith("repair-")} | ({"amortize"} if len(modes) > 1 else set())
    for policy in ("amortize", "forget", "auto"):
        if policy in needed:
            run = OraclePolicyRun(policy, rows=old_rows)
            apply_edit(model, run, new, edit, slot, cfg)
            out[policy] = ModeRows(run.rows, run.recomputed, run.signal_tokens,
                                   next(iter(run.choices), None), run.signals[0] if run.signals else None)
    for m in modes:
        if m.startswith("repair-"):
            out[m] = repaired(model, out["amortize"], new, edit.new_end, int(m.split("-")[1]))
    return {m: out[m] for m in [EXACT, *modes]}


def repaired(model, amortized: ModeRows, new: list[int], start: int, window: int) -> ModeRows:
    """``amortized`` with the rows ``[start, start + window)`` recomputed on the (exact) rows before them."""
    end = min(len(new), start + window)
    if end <= start:
        return amortized
    rows = amortized.rows
    _, fresh = prefill(model, new[start:end], start, take(rows, 0, start), keep=1)
    return ModeRows(cat(take(rows, 0, start), fresh, take(rows, end, length(rows))), amortized.recomputed + end - start)


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
