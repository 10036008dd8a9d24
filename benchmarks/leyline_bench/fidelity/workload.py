"""The fidelity workload: ≥ 50 edit cases over agent histories, deterministic.

    python -m leyline_bench.fidelity.workload [--out benchmarks/fidelity_workload.jsonl]

Each case is one JSON line: ``name``, ``category``, ``group``, ``history``
(messages), ``directives`` (one batch) or ``edits`` (sequential batches),
``target`` (a value the final answer must contain) and ``expected_delta``
where the case fixes the token delta. Histories are held-out synthetic
transcripts: a system prompt, one or more earlier conversations (the edit
material), then a final task whose answer is the target, cut just before
that answer. Categories:

* ``drop_failed_attempt`` — delete a failed tool call and its error output;
* ``clear_old_tool_output`` — replace an earlier tool output by ``[cleared]``;
* ``truncate_long_output`` — cut a long tool output to its first 10 lines;
* ``replace_message`` — rephrase the first user message;
* ``multi_edit_drift`` — k = 1, 2, 4, 8 sequential batches, each clearing one more old output;
* ``position_stress`` — grow an early tool output by exactly δ = 1, 127, 128, 129, 1024 tokens.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from leyline_sdk.protocol import Directive, Message, Span

from leyline_runtime.model.default import default_tokenizer_path
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..common import agent_text
from ..common.exact import grow, token_delta
from ..common.histories import PLACEHOLDER

DEFAULT_OUT = Path(__file__).resolve().parents[3] / "benchmarks" / "fidelity_workload.jsonl"
BUDGET = 2900  # tokens: leaves room for a 1024-token insertion and the greedy continuation
TRUNCATE_LINES = 10
PER_CATEGORY = 8
DRIFT_KS = (1, 2, 4, 8)
DRIFT_BASES = 3
STRESS_DELTAS = (1, 127, 128, 129, 1024)
STRESS_BASES = 2
PRIOR_SEED0 = 5000  # earlier conversations come from their own seed range


@dataclass
class Base:
    """A history: system + earlier conversations + the final task, cut before its answer."""

    final_seed: int
    prior_seeds: list[int]
    messages: list[Message]
    prior_end: int  # messages[1:prior_end] are the earlier conversations
    target: str
    tags: dict = field(default_factory=dict)


def build_base(final_seed: int, prior_seeds: list[int]) -> Base:
    messages = [agent_text.system()]
    for s in prior_seeds:
        messages += agent_text.conversation(s)
    prior_end = len(messages)
    messages += agent_text.conversation(final_seed)[:-1]
    return Base(final_seed, prior_seeds, messages, prior_end, agent_text.final_target(final_seed))


def size(tok: ChatTokenizer, messages: list[Message]) -> int:
    return sum(map(len, tok.encode_messages(messages)))


def with_prior(tok: ChatTokenizer, final_seed: int, prior_iter: Iterator[int], min_outputs: int = 1,
               budget: int = BUDGET) -> Base | None:
    """Add earlier conversations until they hold ``min_outputs`` tool outputs; None if over budget."""
    priors: list[int] = []
    while True:
        base = build_base(final_seed, priors)
        if size(tok, base.messages) > budget:
            return None
        if len(prior_tool_outputs(base)) >= min_outputs:
            return base
        priors.append(next(prior_iter))


def prior_tool_outputs(base: Base) -> list[int]:
    return [i for i in range(1, base.prior_end) if base.messages[i].role == "tool"]


def failed_rounds(base: Base) -> list[int]:
    """Index of each failed call (assistant with tool calls, then an error output, then a retry)."""
    m = base.messages
    return [i for i in range(1, len(m) - 2)
            if m[i].role == "assistant" and m[i].tool_calls and len(m[i].tool_calls) == 1
            and m[i + 1].role == "tool" and m[i + 1].content.startswith("Error") and m[i + 2].role == "assistant"]


def long_outputs(base: Base, lines: int = TRUNCATE_LINES) -> list[int]:
    return [i for i, msg in enumerate(base.messages) if msg.role == "tool" and msg.content.count("\n") >= lines + 2]


def dump(messages: list[Message]) -> list[dict]:
    return [m.model_dump(exclude_none=True) for m in messages]


def directive(start: int, end: int, replacement: list[Message]) -> dict:
    return Directive(span=Span(start=start, end=end), replacement=replacement).model_dump(exclude_none=True)


def case(name: str, category: str, base: Base, group: str = "", **edit) -> dict:
    out = {"name": name, "category": category, "group": group, "history": dump(base.messages)}
    out.update(edit)
    out["target"] = base.target
    out["source"] = {"final_seed": base.final_seed, "prior_seeds": base.prior_seeds}
    return out


class Seeds:
    """Final-task seeds and earlier-conversation seeds, each consumed once."""

    def __init__(self):
        self.final = iter(range(100000))
        self.prior = iter(range(PRIOR_SEED0, PRIOR_SEED0 + 100000))


def drop_failed(tok, seeds: Seeds) -> list[dict]:
    out = []
    while len(out) < PER_CATEGORY:
        base = with_prior(tok, next(seeds.final), seeds.prior)
        fails = failed_rounds(base) if base else []
        fails = [i for i in fails if i >= base.prior_end] or fails if base else []
        if not fails:
            continue
        i = fails[-1]
        out.append(case(f"drop_failed_{len(out)}", "drop_failed_attempt", base, directives=[directive(i, i + 2, [])]))
    return out


def clear_old(tok, seeds: Seeds) -> list[dict]:
    out = []
    while len(out) < PER_CATEGORY:
        base = with_prior(tok, next(seeds.final), seeds.prior, min_outputs=2)
        if base is None:
            continue
        i = max(prior_tool_outputs(base), key=lambda k: len(base.messages[k].content))
        rep = base.messages[i].model_copy(update={"content": PLACEHOLDER})
        out.append(case(f"clear_old_{len(out)}", "clear_old_tool_output", base,
                        directives=[directive(i, i + 1, [rep])]))
    return out


def truncated(message: Message, lines: int = TRUNCATE_LINES) -> Message:
    kept = message.content.split("\n")
    more = len(kept) - lines
    return message.model_copy(update={"content": "\n".join(kept[:lines]) + f"\n... [{more} more lines truncated]"})


def truncate_long(tok, seeds: Seeds) -> list[dict]:
    out = []
    while len(out) < PER_CATEGORY:
        base = with_prior(tok, next(seeds.final), seeds.prior)
        longs = long_outputs(base) if base else []
        if not longs:
            continue
        early = [i for i in longs if i < base.prior_end]
        i = max(early or longs, key=lambda k: len(base.messages[k].content))
        out.append(case(f"truncate_{len(out)}", "truncate_long_output", base,
                        directives=[directive(i, i + 1, [truncated(base.messages[i])])]))
    return out


def replace_first_user(tok, seeds: Seeds) -> list[dict]:
    out = []
    while len(out) < PER_CATEGORY:
        base = with_prior(tok, next(seeds.final), seeds.prior)
        if base is None:
            continue
        i = next(k for k, m in enumerate(base.messages) if m.role == "user")
        text = base.messages[i].content
        rep = base.messages[i].model_copy(update={"content": "Quick question: " + text[:1].lower() + text[1:]})
        out.append(case(f"replace_{len(out)}", "replace_message", base, directives=[directive(i, i + 1, [rep])]))
    return out


def drift(tok, seeds: Seeds) -> list[dict]:
    out = []
    bases = 0
    while bases < DRIFT_BASES:
        base = with_prior(tok, next(seeds.final), seeds.prior, min_outputs=max(DRIFT_KS))
        if base is None:
            continue
        outputs = prior_tool_outputs(base)
        for k in DRIFT_KS:
            batches = [[directive(i, i + 1, [base.messages[i].model_copy(update={"content": PLACEHOLDER})])]
                       for i in outputs[:k]]
            out.append(case(f"drift_k{k}_{bases}", "multi_edit_drift", base, group=f"k={k}", edits=batches))
        bases += 1
    return out


def position_stress(tok, seeds: Seeds) -> list[dict]:
    out = []
    bases = 0
    while bases < STRESS_BASES:
        base = with_prior(tok, next(seeds.final), seeds.prior, budget=BUDGET - max(STRESS_DELTAS))
        if base is None:
            continue
        i = prior_tool_outputs(base)[0]
        for delta in STRESS_DELTAS:
            rep = grow(tok, base.messages[i], delta)
            assert token_delta(tok, [base.messages[i]], [rep]) == delta
            out.append(case(f"stress_d{delta}_{bases}", "position_stress", base, group=f"δ={delta}",
                            directives=[directive(i, i + 1, [rep])], expected_delta=delta))
        bases += 1
    return out


BUILDERS = (drop_failed, clear_old, truncate_long, replace_first_user, drift, position_stress)


def build_workload(tok: ChatTokenizer | None = None) -> list[dict]:
    tok = tok or ChatTokenizer.from_file(default_tokenizer_path())
    seeds = Seeds()
    return [c for builder in BUILDERS for c in builder(tok, seeds)]


def write_jsonl(cases: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in cases)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    cases = build_workload()
    write_jsonl(cases, args.out)
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
