"""One real edit measured under every mode against an exact prefill of the edited history.

Per mode: the next turn (the session's next round and an assistant header, teacher-forced) scored
position by position against the reference (JSD in nats, top-1 agreement; *probe*: the header's
position), the reference's greedy continuation after it (tokens equal before the first difference),
the rows the mode recomputed, and — where the removed text supports one (:mod:`.removed_content`) —
the greedy reply to a question asked right after the edit, whether it holds the removed value, and
the log-probability the mode's rows give that value (its first answer, teacher-forced after the
question). The unedited history (F) answers the same question from its own rows.
"""

from __future__ import annotations

from leyline_sdk.protocol import Message
from .drift_oracle import Rows, diff, layer0_error, prefill
from ..fidelity.policies import jsd_rows
from .real_edits import RealEdit, Renderer
from .real_modes import EXACT, agreeing_prefix, answer_logprob, continue_all, edited_rows
from .removed_content import answers, question_for


def run_edit(model, render: Renderer, edit: RealEdit, old_rows: Rows, slot, cfg, modes: list[str],
             greedy_tokens: int, answer_tokens: int, ask: bool = True) -> dict | None:
    """The record of one edit (None where the edited history cannot be appended to token for token)."""
    old, new = edit.history.tokens, render.ids(edit.messages)
    turn = render.appended(edit.messages, edit.history.next_turn)
    if turn is None:
        return None
    e = diff(old, new)
    rows = edited_rows(model, old_rows, new, e, slot, cfg, modes)
    names = list(rows)
    stop = render.stop_ids()
    logits, greedy = continue_all(model, [rows[m].rows for m in names], turn, greedy_tokens, set(), keep=len(turn))
    reference = logits[0].float()
    forget_work = len(new) - e.start
    record = {"session": edit.history.session, "kind": edit.kind, "first_round": edit.history.first_round,
              "history_tokens": len(old), "edited_tokens": len(new), "start": e.start, "old_end": e.old_end,
              "new_end": e.new_end, "delta": e.delta, "tail": len(new) - e.new_end, "depth": e.start / len(old),
              "turn_tokens": len(turn), "forget_tokens": forget_work, "modes": {}}
    for k, m in enumerate(names):
        jsd = jsd_rows(reference, logits[k].float())
        top1 = (reference.argmax(-1) == logits[k].float().argmax(-1)).tolist()
        same, compared = agreeing_prefix(greedy[0], greedy[k], stop)
        r = rows[m]
        record["modes"][m] = {"recomputed": r.recomputed, "share": r.recomputed / forget_work if forget_work else None,
                              "signal_tokens": r.signal_tokens, "choice": r.choice, "signal": r.signal,
                              "next_jsd": jsd.tolist(), "next_top1": top1, "probe_top1": top1[-1],
                              "probe_jsd": float(jsd[-1]), "greedy_same": same, "greedy_compared": compared}
    del logits
    if "amortize" in rows and len(new) > e.new_end:
        record["layer0_rotary_max_rel_err"] = layer0_error(rows["amortize"].rows, rows[EXACT].rows, e.new_end,
                                                           len(new), slot)
    if ask:
        record["question"] = _ask(model, render, edit, rows, names, old_rows, answer_tokens, stop)
    return record


def _ask(model, render: Renderer, edit: RealEdit, rows, names: list[str], old_rows: Rows, answer_tokens: int,
         stop: set[int]) -> dict | None:
    """The removed-content question, asked on every mode's rows and on the unedited history's (``F``)."""
    question = question_for(edit.removed, render.text(edit.messages))
    if question is None:
        return None
    asked = [Message(role="user", content=question.text)]
    prompt, f_prompt = render.appended(edit.messages, asked), render.appended(edit.history.messages, asked)
    if prompt is None or f_prompt is None:
        return None
    _, replies = continue_all(model, [rows[m].rows for m in names], prompt, answer_tokens, stop)
    _, (f_reply,) = continue_all(model, [old_rows], f_prompt, answer_tokens, stop)
    texts = {m: _text(render, r, stop) for m, r in zip(names, replies)} | {"F": _text(render, f_reply, stop)}
    target = render.tokenizer(question.answers[0], add_special_tokens=False)["input_ids"]
    logprobs = dict(zip(names, answer_logprob(model, [rows[m].rows for m in names], prompt, target)))
    logprobs["F"] = answer_logprob(model, [old_rows], f_prompt, target)[0]
    return {"kind": question.kind, "text": question.text, "answers": list(question.answers),
            "replies": texts, "answered": {m: answers(question, t) for m, t in texts.items()},
            "answer_logprob": logprobs}


def _text(render: Renderer, tokens: list[int], stop: set[int]) -> str:
    return render.tokenizer.decode([t for t in tokens if t not in stop])


def history_rows(model, tokens: list[int]) -> Rows:
    """The rows of a fresh prefill of ``tokens`` (the unedited history every mode starts from)."""
    return prefill(model, tokens, 0, [], keep=1)[1]
