"""Agent traces with the history edits agents really make, deterministic.

    python -m leyline_bench.agent.synthetic_traces [--out benchmarks/traces.jsonl] [--per-pattern 3]

One trace per JSON line: ``{"name", "pattern", "turns": [[messages], ...]}``,
each turn the FULL history the agent sends at that model call. Turn 1 is the
system prompt and the task; every later turn adds the previous call and its
tool output, then applies the pattern's edit (message ids are kept, LangGraph
style, so an edited message is a replacement):

* ``retry_and_drop`` — every third call fails; the next call retries with the
  error in view, and the turn after that the failed call and its error are dropped;
* ``clear_tool_uses`` — tool outputs older than the 3 most recent become
  ``[cleared]`` (LangChain ``ClearToolUsesEdit(keep=3)``): the edit point moves every turn;
* ``truncate_outputs`` — every tool output but the newest is cut to 10 lines;
* ``summarise`` — every 4 calls, everything between the task and the last 2
  calls is replaced by one summary message.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from leyline_sdk.protocol import Message

from leyline_runtime.model.default import default_tokenizer_path
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..common import agent_text
from ..common.histories import PLACEHOLDER
from ..fidelity.workload import truncated

DEFAULT_OUT = Path(__file__).resolve().parents[3] / "benchmarks" / "traces.jsonl"
PATTERNS = ("retry_and_drop", "clear_tool_uses", "truncate_outputs", "summarise")
KEEP = 3
TRUNCATE_LINES = 10
SUMMARY_EVERY = 4
SUMMARY_KEEP_ROUNDS = 2
BUDGET = 3500  # tokens per turn: the default model's context is 4096
SEED0 = {"retry_and_drop": 100, "clear_tool_uses": 200, "truncate_outputs": 300, "summarise": 400}


class Ids:
    def __init__(self, prefix: str):
        self.prefix, self.n = prefix, 0

    def tag(self, message: Message) -> Message:
        self.n += 1
        return message.model_copy(update={"id": f"{self.prefix}-{self.n}"})


def _rounds(seed: int, failed: bool) -> Iterator[agent_text.Round]:
    for r in agent_text.round_stream(seed):
        if r.failed == failed:
            yield r


def _size(tok: ChatTokenizer, messages: list[Message]) -> int:
    return sum(map(len, tok.encode_messages(messages)))


class TraceBuilder:
    def __init__(self, tok: ChatTokenizer, pattern: str, index: int):
        self.tok, self.pattern = tok, pattern
        seed = SEED0[pattern] + 10 * index
        self.ids = Ids(f"{pattern}-{index}")
        self.good, self.bad = _rounds(seed, False), _rounds(seed + 5, True)
        self.history = [self.ids.tag(agent_text.system()), self.ids.tag(agent_text.user_tasks(seed)[0])]
        self.turns = [list(self.history)]
        self.calls = 0
        self.failed_pair: set[str] = set()
        self.pending_drop: set[str] = set()

    def next_round(self, failed: bool) -> list[Message]:
        """The next round that keeps the turn under budget (good rounds are skipped when too long)."""
        source = self.bad if failed else self.good
        room = BUDGET - _size(self.tok, self.history)
        for _ in range(200):
            r = next(source)
            msgs = [self.ids.tag(r.call), self.ids.tag(r.output)]
            if _size(self.tok, msgs) <= min(room, 450):
                return msgs
        raise RuntimeError("no round fits the budget")

    def step(self) -> None:
        self.calls += 1
        if self.pattern == "retry_and_drop":
            self._retry_and_drop()
        else:
            self.history += self.next_round(False)
            getattr(self, f"_edit_{self.pattern}")()
        self.turns.append(list(self.history))

    def _retry_and_drop(self) -> None:
        if self.pending_drop:  # the retry is in the history: drop the failed call and its error
            self.history = [m for m in self.history if m.id not in self.pending_drop]
        self.pending_drop, self.failed_pair = self.failed_pair, set()
        fail = self.calls % 3 == 1
        new = self.next_round(fail)
        if fail:
            self.failed_pair = {m.id for m in new}
        self.history += new

    def _tool_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.history) if m.role == "tool"]

    def _edit_clear_tool_uses(self) -> None:
        for i in self._tool_indices()[:-KEEP]:
            self.history[i] = self.history[i].model_copy(update={"content": PLACEHOLDER})

    def _edit_truncate_outputs(self) -> None:
        for i in self._tool_indices()[:-1]:
            if self.history[i].content.count("\n") >= TRUNCATE_LINES + 2:
                self.history[i] = truncated(self.history[i], TRUNCATE_LINES)

    def _edit_summarise(self) -> None:
        if self.calls % SUMMARY_EVERY:
            return
        old = self.history[2: len(self.history) - 2 * SUMMARY_KEEP_ROUNDS]
        names = [c.function.name for m in old for c in (m.tool_calls or [])]
        text = (f"Summary of the earlier work: {len(names)} tool calls ({', '.join(sorted(set(names)))}); "
                "their results are folded into this note and the next steps continue from here.")
        summary = self.ids.tag(Message(role="user", content=text))
        self.history[2: len(self.history) - 2 * SUMMARY_KEEP_ROUNDS] = [summary]


def make_trace(tok: ChatTokenizer, pattern: str, index: int) -> dict:
    builder = TraceBuilder(tok, pattern, index)
    num_turns = 8 + (3 * index + len(pattern)) % 8  # 8..15 turns
    for _ in range(num_turns - 1):
        builder.step()
    return {"name": f"{pattern}-{index}", "pattern": pattern,
            "turns": [[m.model_dump(exclude_none=True) for m in turn] for turn in builder.turns]}


def build_traces(per_pattern: int = 3, tok: ChatTokenizer | None = None) -> list[dict]:
    tok = tok or ChatTokenizer.from_file(default_tokenizer_path())
    return [make_trace(tok, p, i) for p in PATTERNS for i in range(per_pattern)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--per-pattern", type=int, default=3)
    args = parser.parse_args(argv)
    traces = build_traces(args.per_pattern)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(t, ensure_ascii=False, sort_keys=True) + "\n" for t in traces)
    print(f"wrote {len(traces)} traces to {args.out}")


if __name__ == "__main__":
    main()
