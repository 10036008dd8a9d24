"""When does a fidelity case count as evidence? When F and R agree on the target.

Definitions (``c`` = a greedy continuation after the assistant header: ``G``
token ids; ``a`` = the answer, ``c`` cut before its first end marker;
``t`` = the target string):

* ``c`` **hits** ``t`` when the decoded text of ``a`` contains ``t``, or when
  ``a`` ran out of budget while spelling ``t`` (no end marker in ``c``,
  ``len(a) = G``, and ``a`` equals the first ``G`` tokens of ``encode(t)``: a
  target longer than the budget).
* Without a target, the target is R's own first ``IMPLICIT_TOKENS`` greedy
  tokens and ``c`` hits it when it starts with exactly those tokens.
* A case is **admitted** when F's and R's continuations both hit the target:
  only then does R (the honest edited re-prefill) still know the answer the
  unedited history gave, so L can be judged on keeping it. A case where only
  the deleted span held the answer (F hits, R misses) is a diagnostic.
* L **preserves** the target when its continuation hits it.
"""

from __future__ import annotations

from dataclasses import dataclass

from leyline_runtime.text.tokenizer import ChatTokenizer

IMPLICIT_TOKENS = 8


@dataclass
class Verdict:
    f_hits: bool
    r_hits: bool
    l_hits: bool
    implicit_target: bool

    @property
    def admitted(self) -> bool:
        return self.f_hits and self.r_hits

    @property
    def reason(self) -> str:
        if self.admitted:
            return "admitted"
        if self.f_hits:
            return "R misses the target (the edit removed what the answer needs)"
        if self.r_hits:
            return "F misses the target"
        return "neither F nor R produces the target"


def answer(tok: ChatTokenizer, cont: list[int]) -> list[int]:
    return cont[: cont.index(tok.end_id)] if tok.end_id in cont else cont


def hits(tok: ChatTokenizer, cont: list[int], target: str, budget: int) -> bool:
    a = answer(tok, cont)
    if target and target in tok.decode(a):
        return True
    want = tok.encode(target)
    return len(a) == len(cont) >= budget and len(want) > len(a) and a == want[: len(a)]


def starts_with(cont: list[int], prefix: list[int]) -> bool:
    return len(prefix) > 0 and cont[: len(prefix)] == prefix


def judge(tok: ChatTokenizer, f: list[int], r: list[int], l_: list[int], target: str | None,
          budget: int) -> Verdict:
    if target:
        return Verdict(hits(tok, f, target, budget), hits(tok, r, target, budget), hits(tok, l_, target, budget),
                       False)
    prefix = r[:IMPLICIT_TOKENS]
    return Verdict(starts_with(f, prefix), starts_with(r, prefix), starts_with(l_, prefix), True)
