"""Which mode each edit of a batch was applied in, and why not the one asked for: once for both engines.

The bundled runtime (:meth:`leyline_runtime.directives.executor.DirectiveExecutor._choose_modes`) and the
vLLM plugin (``leyline_vllm.api_server.edits``) each know what their cache did with the rows after an
edit; the rule that turns those facts into a directive's ``applied_mode`` and ``fallback_reason`` is
this one, with these words (a reason is a word, or ``"<word>: <detail>"``):

* an ``erase`` edit (``Directive.intent``) is planned and applied as ``forget`` with :data:`ERASE`, whatever
  mode was asked (:func:`planned_mode`): the rows after it were computed while the removed content was
  there and carry what the model noted of it, and no correction short of recomputing them from the
  edit is yet measured to leave nothing of it answering; a ``shrink`` takes the mode asked;
* a ``forget`` recomputes everything after its start: every later edit of the batch is ``forget``
  with :data:`AFTER_FORGET`; an edit *before* it keeps its mode (the rows between the two still move);
* an edit with nothing of the old history after it moves no rows: it is applied as asked;
* an engine that cannot rotate this model's cache (:data:`UNSUPPORTED_RUNTIME`) recomputes from the
  first edit that would move rows on, so later edits are :data:`AFTER_FORGET`;
* rows after one edit that the engine recomputed though it could rotate them (too few to be worth it:
  :data:`SHORT_RUN`; vLLM moves one run per batch: :data:`ONE_RUN_PER_BATCH`; mode auto decided the
  batch's run: :data:`AUTO_FORGET`, :data:`DRIFT_REPAIR`; nothing saved to move: :data:`NO_SAVED_ROWS`): that
  edit only is ``forget``;
* every row recomputed (saved rows could not be loaded): every edit is ``forget`` with that reason.

``auto`` edits count as amortize here (they are planned as one); what auto chose is reported in their
``AutoDecision``. Plain Python: no torch, so the vLLM API server imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from leyline_sdk.protocol import AutoDecision

AFTER_FORGET = "after_forget"  # an earlier directive of the batch already recomputes this part
UNSUPPORTED_RUNTIME = "unsupported_runtime"  # this engine cannot rotate this model's cache (detail: why)
SHORT_RUN = "short_run"  # the rows after the edit are too few to be worth rotating
ONE_RUN_PER_BATCH = "one_run_per_batch"  # vLLM rotates one run of a batch; this edit's run was recomputed
AUTO_FORGET = "auto_forget"  # mode auto, deciding the batch's rotated run, chose forget
DRIFT_REPAIR = "drift_repair"  # the session's drift passed its budget: recomputed from the earliest drift
# an AutoDecision's reason where vLLM measured nothing for the edit (a batch with a forget, a failed load)
NOT_MEASURED = "not_measured"
ERASE = "erase"  # the edit erases content: what follows it is recomputed, never moved
NO_SAVED_ROWS = "no_saved_rows"  # vLLM: the session holds no saved rows (its last save failed): nothing to move


def reason(word: str, detail: str | None = None) -> str:
    return word if detail is None else f"{word}: {detail}"


def planned_mode(mode: str, intent: str) -> str:
    """The mode an edit is planned in: ``forget`` for an ``erase``, else the mode asked."""
    return "forget" if intent == "erase" else mode


def erased_auto(requested: str, fallback_reason: str | None) -> AutoDecision | None:
    """An ``auto`` edit that erases: the choice made for it (forget, :data:`ERASE`); None otherwise."""
    return AutoDecision(choice="forget", reason=ERASE) if requested == "auto" and fallback_reason == ERASE else None


@dataclass(frozen=True)
class Applied:
    mode: str  # "amortize" or "forget"
    fallback_reason: str | None = None


def applied_modes(requested: Sequence[str], *, intents: Sequence[str] | None = None,
                  moves_rows: Sequence[bool] | None = None, unsupported: str | None = None,
                  recomputed: Mapping[int, str] | None = None, recomputed_all: str | None = None) -> list[Applied]:
    """Per edit, in span order: what was applied and why not what was asked.

    ``requested``: each edit's mode; ``intents``: each edit's intent (None: every one a shrink);
    ``moves_rows``: something of the old history follows the edit (None: every edit); ``unsupported``: why this engine cannot rotate this model's cache (None: it
    can); ``recomputed``: edits (by index) whose following rows the engine recomputed, with the reason;
    ``recomputed_all``: why every row of the batch was recomputed (None: they were not)."""
    if recomputed_all is not None:
        return [Applied("forget", recomputed_all) for _ in requested]
    recomputed = recomputed or {}
    out: list[Applied] = []
    forgotten = False  # an earlier edit recomputes everything after it
    for k, mode in enumerate(requested):
        if mode != "forget" and intents is not None and planned_mode(mode, intents[k]) == "forget":
            out.append(Applied("forget", ERASE))
            forgotten = True
        elif mode == "forget":
            out.append(Applied("forget"))
            forgotten = True
        elif forgotten:
            out.append(Applied("forget", AFTER_FORGET))
        elif moves_rows is not None and not moves_rows[k]:
            out.append(Applied("amortize"))
        elif unsupported is not None:
            out.append(Applied("forget", reason(UNSUPPORTED_RUNTIME, unsupported)))
            forgotten = True
        elif k in recomputed:
            out.append(Applied("forget", recomputed[k]))
        else:
            out.append(Applied("amortize"))
    return out
