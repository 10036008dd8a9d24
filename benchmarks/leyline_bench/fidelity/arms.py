"""Fidelity harness: how far does an amortized edit drift from an honest re-prefill?

Four arms for one history and one edit (a directive batch):

* **F** — the full original history;
* **R** — an honest re-prefill of the edited history (the reference);
* **L** — Leyline amortize: the original session edited in place;
* **N** — the naive splice: like L but with no rope rotation (δ ignored).

Compared on the next-token distribution after the assistant header (JSD,
top-1 agreement, top-10 overlap) and on greedy continuations (tokens until
L and R first diverge).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from leyline_sdk.protocol import Directive, DirectiveBatch, Message, SessionCreate

from leyline_runtime.inspection import Inspector
from leyline_runtime.runtime import Runtime

TENANT = "__fidelity__"


@dataclass
class ArmComparison:
    jsd: float
    top1_agree: bool
    top10_overlap: float


@dataclass
class FidelityReport:
    l_vs_r: ArmComparison
    n_vs_r: ArmComparison
    f_vs_r: ArmComparison
    greedy_divergence: int  # tokens until L's greedy continuation first differs from R's (= length if never)
    greedy_tokens: int
    r_greedy: list[int]
    l_greedy: list[int]
    f_greedy: list[int]
    # Per directive of L's batches, in order: the token delta and the mode actually applied.
    deltas: list[int] = field(default_factory=list)
    applied_modes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def jsd(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """Jensen-Shannon divergence (nats) between the softmax distributions."""
    p = torch.softmax(p_logits.double(), -1)
    q = torch.softmax(q_logits.double(), -1)
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.sum(torch.where(a > 0, a * (torch.log(a) - torch.log(b)), torch.zeros_like(a)))

    return float(0.5 * kl(p, m) + 0.5 * kl(q, m))


def compare(ref: torch.Tensor, other: torch.Tensor) -> ArmComparison:
    top_ref = set(torch.topk(ref, 10).indices.tolist())
    top_other = set(torch.topk(other, 10).indices.tolist())
    return ArmComparison(jsd=jsd(ref, other), top1_agree=int(ref.argmax()) == int(other.argmax()),
                         top10_overlap=len(top_ref & top_other) / 10)


def next_token_logits(runtime: Runtime, session_id: str, tenant: str = TENANT) -> torch.Tensor:
    """Logits after an assistant header, without changing the session (in the harness's tenant unless told)."""
    return Inspector(runtime).next_token_logits(session_id, tenant)


def greedy_continuation(runtime: Runtime, session_id: str, max_tokens: int, tenant: str = TENANT) -> list[int]:
    """Greedy tokens after an assistant header, without changing the session (in the harness's tenant unless told)."""
    return Inspector(runtime).greedy_continuation(session_id, max_tokens, tenant)


def run_arms(runtime: Runtime, history: list[Message], directives: list[Directive],
             greedy_tokens: int = 16) -> FidelityReport:
    return run_arms_batches(runtime, history, [directives], greedy_tokens)


def run_arms_batches(runtime: Runtime, history: list[Message], batches: list[list[Directive]],
                     greedy_tokens: int = 16) -> FidelityReport:
    """Like :func:`run_arms` for a sequence of batches applied one after another to L and N
    (multi-edit drift); R is a fresh prefill of the final edited history."""
    ids = {}
    outcomes = []
    try:
        for arm in ("F", "L", "N"):
            ids[arm] = runtime.create_session(SessionCreate(messages=history), TENANT).session_id
        for directives in batches:
            result = runtime.apply(DirectiveBatch(session_id=ids["L"], directives=directives), TENANT)
            outcomes.extend(result.outcomes)
            runtime.apply(DirectiveBatch(session_id=ids["N"], directives=directives), TENANT, rotate=False)
        edited, _ = runtime.session_messages(ids["L"], TENANT)
        ids["R"] = runtime.create_session(SessionCreate(messages=edited), TENANT).session_id
        logits = {arm: next_token_logits(runtime, sid) for arm, sid in ids.items()}
        conts = {arm: greedy_continuation(runtime, ids[arm], greedy_tokens) for arm in ("R", "L", "F")}
    finally:
        for sid in ids.values():
            if runtime.has_session(sid, TENANT):
                runtime.delete_session(sid, TENANT)
    r, l_ = conts["R"], conts["L"]
    diverge = next((i for i, (a, b) in enumerate(zip(r, l_)) if a != b), min(len(r), len(l_)))
    return FidelityReport(
        l_vs_r=compare(logits["R"], logits["L"]), n_vs_r=compare(logits["R"], logits["N"]),
        f_vs_r=compare(logits["R"], logits["F"]), greedy_divergence=diverge, greedy_tokens=greedy_tokens,
        r_greedy=r, l_greedy=l_, f_greedy=conts["F"],
        deltas=[o.delta for o in outcomes], applied_modes=[o.applied_mode for o in outcomes])
