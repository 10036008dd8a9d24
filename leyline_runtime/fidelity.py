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

from dataclasses import asdict, dataclass

import torch

from leyline_sdk.protocol import Directive, DirectiveBatch, GenerateRequest, Message, SessionCreate

from .runtime import Runtime

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
    """Logits after an assistant header, without changing the session."""
    with runtime._lock:
        session = runtime._get(tenant, session_id)
        n = session.num_tokens
        blocks = len(session.table.blocks)
        runtime._grow(session, n + 1)
        try:
            return runtime.engine.prefill(session.table, [runtime.tokenizer.role_ids["assistant"]], n).clone()
        finally:
            runtime._shrink(session, blocks)


def greedy(runtime: Runtime, session_id: str, max_tokens: int, tenant: str = TENANT) -> list[int]:
    """Greedy continuation tokens (changes the session: use throwaway sessions)."""
    runtime.generate(session_id, GenerateRequest(max_tokens=max_tokens, temperature=0.0), tenant)
    with runtime._lock:
        return runtime._get(tenant, session_id).message_tokens[-1][1:]


def run_arms(runtime: Runtime, history: list[Message], directives: list[Directive],
             greedy_tokens: int = 16) -> FidelityReport:
    ids = {}
    try:
        for arm in ("F", "L", "N"):
            ids[arm] = runtime.create_session(SessionCreate(messages=history), TENANT).session_id
        runtime.apply(DirectiveBatch(session_id=ids["L"], directives=directives), TENANT)
        runtime.apply(DirectiveBatch(session_id=ids["N"], directives=directives), TENANT, rotate=False)
        edited, _ = runtime.session_messages(ids["L"], TENANT)
        ids["R"] = runtime.create_session(SessionCreate(messages=edited), TENANT).session_id
        logits = {arm: next_token_logits(runtime, sid) for arm, sid in ids.items()}
        conts = {arm: greedy(runtime, ids[arm], greedy_tokens) for arm in ("R", "L", "F")}
    finally:
        for sid in ids.values():
            if runtime.has_session(sid, TENANT):
                runtime.delete_session(sid, TENANT)
    r, l_ = conts["R"], conts["L"]
    diverge = next((i for i, (a, b) in enumerate(zip(r, l_)) if a != b), min(len(r), len(l_)))
    return FidelityReport(
        l_vs_r=compare(logits["R"], logits["L"]), n_vs_r=compare(logits["R"], logits["N"]),
        f_vs_r=compare(logits["R"], logits["F"]), greedy_divergence=diverge, greedy_tokens=greedy_tokens,
        r_greedy=r, l_greedy=l_, f_greedy=conts["F"])
