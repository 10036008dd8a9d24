"""One real edit, measured as the agent sees it: the next action under every mode against an exact prefill.

Per mode (:mod:`.real_modes`; ``exact`` the reference, arm 0 of every batch): the next assistant turn
generated greedily after the edited history and an assistant header, up to the end of its first action
(or ``action_tokens``), and its action (:mod:`.agent_action`) against the exact prefill's. Then, teacher-
forced on the exact prefill's turn: the mean KL(exact || mode) over its positions, and the log-likelihood
the mode's rows give that turn minus the one they give the turn the *unedited* history (``F``) generates —
the margin by which the mode prefers what the edit leads to over what the model did before the edit
(where the two turns differ; where they do not, the edit did not change the next turn and there is no
margin to measure). ``F``'s action is compared too: how often the edit changes the action at all.
"""

from __future__ import annotations

import torch

from .agent_action import action_of, action_stops, same_word
from .drift_oracle import Rows, diff
from .real_edits import RealEdit, Renderer
from .real_modes import EXACT, continue_all, edited_rows

UNEDITED = "F"


def assistant_ends(render: Renderer, messages, after: int, count: int) -> list[int]:
    """Token positions where the first ``count`` assistant turns ending after token ``after`` end in the
    render of ``messages`` (the template renders each prefix as a token prefix of the whole; checked)."""
    whole, ends = render.ids(messages), []
    for j, m in enumerate(messages):
        if m.role != "assistant":
            continue
        ids = render.ids(messages[:j + 1])
        if whole[:len(ids)] != ids:
            raise ValueError("the template does not render this history's turns as prefixes of it")
        if len(ids) > after:
            ends.append(len(ids))
            if len(ends) == count:
                break
    return ends


@torch.no_grad()
def teacher_forced(model, arms: list[Rows], header: list[int], turn: list[int]) -> tuple[list[float], list[float]]:
    """Per arm: the log-likelihood (nats) of ``turn`` after ``header``, and the mean over its positions of
    KL(arm 0 || arm)."""
    logits, _ = continue_all(model, arms, header + turn, 1, set(), keep=len(turn) + 1)
    logp = torch.log_softmax(logits[:, :len(turn)].float(), -1)
    del logits
    picked = logp.gather(-1, torch.tensor(turn)[None, :, None].expand(len(arms), -1, 1))
    reference = logp[0]
    kl = [float((reference.exp() * (reference - logp[k])).sum(-1).mean()) for k in range(len(arms))]
    return picked.sum(dim=(1, 2)).tolist(), kl


def measure_edit(model, render: Renderer, edit: RealEdit, old_rows: Rows, slot, cfg, modes: list[str],
                 action_tokens: int) -> dict | None:
    """The record of one edit (None where the edited history cannot be appended to token for token)."""
    old, new = edit.history.tokens, render.ids(edit.messages)
    header, old_header = render.appended(edit.messages, []), render.appended(edit.history.messages, [])
    if header is None or old_header is None:
        return None
    e = diff(old, new)
    needs_turns = max([int(m.rsplit("-", 1)[1]) for m in modes if m.startswith("dependent-")], default=0)
    ends = assistant_ends(render, edit.messages, e.new_end, needs_turns) if needs_turns else None
    rows = edited_rows(model, old_rows, new, e, slot, cfg, modes, turn_ends=ends)
    names = list(rows)
    arms = [rows[m].rows for m in names]
    stop = action_stops(render.tokenizer, render.stop_ids())
    _, turns = continue_all(model, arms, header, action_tokens, stop)
    _, (f_turn,) = continue_all(model, [old_rows], old_header, action_tokens, stop)
    reference = turns[0]
    logl, kl = teacher_forced(model, arms, header, reference)
    f_logl = teacher_forced(model, arms, header, f_turn)[0] if f_turn != reference else None

    def text(tokens: list[int]) -> str:
        return render.tokenizer.decode([t for t in tokens if t not in render.stop_ids()])

    want = action_of(text(reference))
    forget_work = len(new) - e.start
    record = {"session": edit.history.session, "kind": edit.kind, "first_round": edit.history.first_round,
              "history_tokens": len(old), "edited_tokens": len(new), "start": e.start, "new_end": e.new_end,
              "tail": len(new) - e.new_end, "forget_tokens": forget_work, "dependent_ends": ends,
              "turn_tokens": len(reference), "reference_action": bool(want.tool), "reference_tool": want.tool,
              "reference_word": want.word, "modes": {}}
    for k, m in enumerate(names):
        got = action_of(text(turns[k]))
        r = rows[m]
        record["modes"][m] = {"recomputed": r.recomputed, "choice": r.choice, "signal": r.signal,
                              "same_action": got == want, "same_word": same_word(got, want), "has_action": bool(got.tool),
                              "same_turn": turns[k] == reference, "kl": kl[k],
                              "margin": logl[k] - f_logl[k] if f_logl is not None else None}
    got = action_of(text(f_turn))
    record["modes"][UNEDITED] = {"recomputed": 0, "choice": None, "signal": None, "same_action": got == want,
                                 "same_word": same_word(got, want), "has_action": bool(got.tool),
                                 "same_turn": f_turn == reference, "kl": None, "margin": None}
    return record
