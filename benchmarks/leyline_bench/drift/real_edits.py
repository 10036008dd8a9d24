"""Edits taken from real agent sessions, rendered with the model's own chat template.

A *history* is a prefix of one mini-swe-agent session (:mod:`..sessions.load`): its system and task
messages and the rounds after them (an assistant message with a ``bash`` call, then the observation),
cut after an observation so that it renders to at most ``max_tokens`` tokens and the session's next
round (the *next turn*: the assistant's next call and its observation, as the session has them)
renders to at most ``turn_tokens``. In these sessions the system prompt and the task (mini-swe-agent's
instructions alone are ~1.3k tokens) fill 1.4–2.3k tokens, so in a 3k-token history the rounds, and
every edit, start after about half of the context. A failed attempt is rare in those first rounds
(the model seldom fails early), so for ``drop`` a second history may start later: the system and task
messages, then the session's rounds from the one before its first failed attempt on, the earlier
rounds left out as ``trim_messages`` would leave them (``first_round`` says where it starts).

Four edit kinds, one message (or run) of the history each:

* ``clear`` — a tool output's content becomes ``[cleared]`` (LangChain ``ClearToolUsesEdit``'s
  placeholder); outputs of at least ``MIN_CLEAR_CHARS`` characters;
* ``truncate`` — a tool output of at least ``2 * KEEP_LINES + 2`` lines keeps its first and last
  ``KEEP_LINES`` lines, the lines between become one line ``[... N lines truncated ...]``;
* ``drop`` — a failed attempt goes: an assistant call whose observation has a non-zero
  ``<returncode>``, with that observation;
* ``summary`` — ``SUMMARY_MESSAGES`` messages from an assistant call on (two rounds) become one user
  message of a fixed-length extract: ``Summary of the 4 messages omitted here:`` and the first
  ``SUMMARY_CHARS`` characters of their text (prose, commands, outputs; whitespace runs collapsed).

Rendering: the model's chat template with one ``bash`` tool declared (``TOOLS``), so the calls render
as the template renders tool calls (Qwen2.5: ``<tool_call>{"name": "bash", "arguments": {...}}``
inside the assistant turn, observations as ``<tool_response>`` blocks in a user turn). The sessions
keep each call's arguments as a JSON string (OpenAI's format); the Qwen template applies ``tojson`` to
them, which would quote that string a second time, so they are parsed into a mapping first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from leyline_sdk.protocol import Message

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run one bash command in the repository and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]}}}]
KINDS = ("clear", "truncate", "drop", "summary")
PLACEHOLDER = "[cleared]"
MIN_CLEAR_CHARS = 200
KEEP_LINES = 5
SUMMARY_MESSAGES = 4
SUMMARY_CHARS = 256
RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>")


def template_message(m: Message) -> dict:
    """``m`` as chat templates take it: tool-call arguments as a mapping, not a JSON string."""
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"type": "function", "id": c.id,
                              "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                             for c in m.tool_calls]
    return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@dataclass
class Renderer:
    """Token ids of a message list as the model's chat template renders it (with ``TOOLS``)."""

    tokenizer: object

    def text(self, messages: list[Message], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template([template_message(m) for m in messages], tools=TOOLS,
                                                  tokenize=False, add_generation_prompt=generation_prompt)

    def ids(self, messages: list[Message], generation_prompt: bool = False) -> list[int]:
        return self.tokenizer(self.text(messages, generation_prompt), add_special_tokens=False)["input_ids"]

    def appended(self, history: list[Message], more: list[Message]) -> list[int] | None:
        """The tokens ``more`` and an assistant header add after ``history``; None if the render of
        ``history`` is not a token prefix of the longer one (then nothing can be appended to its rows)."""
        base, full = self.ids(history), self.ids(history + more, generation_prompt=True)
        return full[len(base):] if full[:len(base)] == base else None

    def stop_ids(self) -> set[int]:
        t = self.tokenizer
        return {i for i in (t.eos_token_id, t.convert_tokens_to_ids("<|endoftext|>")) if isinstance(i, int) and i >= 0}


@dataclass
class History:
    session: str
    messages: list[Message]
    next_turn: list[Message]
    first_round: int  # the session's round the history's rounds start at (0: the session's own beginning)
    tokens: list[int]
    turn: list[int]  # the next turn's tokens and an assistant header, rendered after ``tokens``


@dataclass
class RealEdit:
    history: History
    kind: str
    target: int  # index of the edited message in ``history.messages``
    messages: list[Message]  # the edited history
    # (command, output text the edit removed); a truncation's starts with the last line it kept
    removed: list[tuple[str, str]] = field(default_factory=list)


def command_of(m: Message) -> str:
    """The bash command of an assistant call (empty if it has none)."""
    if not m.tool_calls:
        return ""
    args = _arguments(m.tool_calls[0].function.arguments)
    return str(args.get("command", "")) if isinstance(args, dict) else str(args)


def failed(m: Message) -> bool:
    code = RETURNCODE.match(m.content) if m.role == "tool" else None
    return bool(code) and int(code.group(1)) != 0


def _round_starts(messages: list[Message]) -> list[int]:
    """Indices (from 2) of assistant calls answered by a tool message right after them."""
    return [i for i in range(2, len(messages) - 1)
            if messages[i].role == "assistant" and messages[i].tool_calls and messages[i + 1].role == "tool"]


def cut_history(render: Renderer, session, max_tokens: int, turn_tokens: int, first_round: int = 0) -> History | None:
    """The longest history of ``session`` (its rounds from ``first_round`` on) within the budgets; None if
    not even one round fits."""
    msgs, starts = session.messages, _round_starts(session.messages)
    if len(msgs) < 4 or msgs[0].role != "system" or first_round >= len(starts):
        return None
    head, begin = msgs[:2], starts[first_round]
    best = None
    for k, cut in enumerate(starts):
        if cut <= begin or msgs[cut - 1].role != "tool":
            continue
        history = head + msgs[begin:cut]
        tokens = render.ids(history)
        if len(tokens) > max_tokens:
            break
        turn = render.appended(history, msgs[cut:cut + 2])
        if turn is not None and len(turn) <= turn_tokens:
            best = History(session.instance_id, history, msgs[cut:cut + 2], first_round, tokens, turn)
    return best


def first_failure(session) -> int | None:
    """The round of the session's first failed attempt."""
    starts = _round_starts(session.messages)
    return next((k for k, i in enumerate(starts) if failed(session.messages[i + 1])), None)


# --- the four edit kinds: each returns the edit of ``h.messages[i]``, or None where it does not apply ---


def clear(h: History, i: int) -> RealEdit | None:
    m = h.messages[i]
    if m.role != "tool" or len(m.content) < MIN_CLEAR_CHARS:
        return None
    new = h.messages[:i] + [m.model_copy(update={"content": PLACEHOLDER})] + h.messages[i + 1:]
    return RealEdit(h, "clear", i, new, [(command_of(h.messages[i - 1]), m.content)])


def truncate(h: History, i: int) -> RealEdit | None:
    m = h.messages[i]
    lines = m.content.split("\n")
    if m.role != "tool" or len(lines) < 2 * KEEP_LINES + 2:
        return None
    middle = lines[KEEP_LINES:-KEEP_LINES]
    kept = lines[:KEEP_LINES] + [f"[... {len(middle)} lines truncated ...]"] + lines[-KEEP_LINES:]
    new = h.messages[:i] + [m.model_copy(update={"content": "\n".join(kept)})] + h.messages[i + 1:]
    # the last kept line leads the removed text: a question may quote it to point at the first line cut
    removed = "\n".join(lines[KEEP_LINES - 1:-KEEP_LINES])
    return RealEdit(h, "truncate", i, new, [(command_of(h.messages[i - 1]), removed)])


def drop(h: History, i: int) -> RealEdit | None:
    m = h.messages[i]
    if m.role != "assistant" or i + 1 >= len(h.messages) or not failed(h.messages[i + 1]):
        return None
    return RealEdit(h, "drop", i, h.messages[:i] + h.messages[i + 2:], [(command_of(m), h.messages[i + 1].content)])


def summary(h: History, i: int) -> RealEdit | None:
    run = h.messages[i:i + SUMMARY_MESSAGES]
    if len(run) < SUMMARY_MESSAGES or run[0].role != "assistant" or run[-1].role != "tool":
        return None
    text = " ".join(" ".join(part.split()) for m in run for part in (m.content, command_of(m)) if part)
    extract = Message(role="user", content=f"Summary of the {SUMMARY_MESSAGES} messages omitted here: "
                                           f"{text[:SUMMARY_CHARS]}")
    removed = [(command_of(run[k - 1]), m.content) for k, m in enumerate(run) if m.role == "tool" and k > 0]
    return RealEdit(h, "summary", i, h.messages[:i] + [extract] + h.messages[i + SUMMARY_MESSAGES:], removed)


EDITS = {"clear": clear, "truncate": truncate, "drop": drop, "summary": summary}


def candidates(h: History, kind: str) -> list[RealEdit]:
    """Every edit of ``kind`` the history admits, in message order: never the system or task message, and
    never the last round (``ClearToolUsesEdit`` keeps the newest outputs; an edit there moves no rows)."""
    return [e for i in range(2, len(h.messages))
            if (e := EDITS[kind](h, i)) is not None and e.messages[-1] is h.messages[-1]]


def histories(render: Renderer, session, max_tokens: int, turn_tokens: int) -> dict[str, History]:
    """The session's history for each kind: its own beginning, and for ``drop``, where that has no failed
    attempt, the history from the round before its first one (absent where none fits)."""
    prefix = cut_history(render, session, max_tokens, turn_tokens)
    out = {kind: prefix for kind in KINDS if prefix is not None}
    if prefix is None or not candidates(prefix, "drop"):
        out.pop("drop", None)
        first = first_failure(session)
        if first:
            later = cut_history(render, session, max_tokens, turn_tokens, first_round=first - 1)
            if later is not None and candidates(later, "drop"):
                out["drop"] = later
    return out


def _spread(cands: list[RealEdit], turn: int) -> list[RealEdit]:
    """The candidates in the order early, middle, late (rotated by ``turn``), then the rest: a history's
    first edits of a kind sit at different depths, and sessions take turns at which depth comes first."""
    if not cands:
        return []
    slots = [0, len(cands) // 2, len(cands) - 1]
    slots = slots[turn % 3:] + slots[:turn % 3]
    order = list(dict.fromkeys(slots + list(range(len(cands)))))
    return [cands[k] for k in order]


def add_edit_selection(p) -> None:
    """The flags that pick the models and the real edits: one set for every command replaying these edits."""
    p.add_argument("--models", default="qwen0.5b=weights:qwen2.5-coder-0.5b-instruct",
                   help="comma list of label=weights:NAME | label=FOLDER | label=random-qwen2")
    p.add_argument("--split", default="heldout", help="which shipped sessions (heldout or calibration)")
    p.add_argument("--sessions", type=int, default=100, help="sessions of the split to take edits from")
    p.add_argument("--edits", type=int, default=48, help="edits per model (the kinds take turns)")
    p.add_argument("--kinds", default=",".join(KINDS), help="edit kinds: " + ", ".join(KINDS))
    p.add_argument("--max-tokens", type=int, default=3000, help="largest history (tokens, the model's template)")
    p.add_argument("--turn-tokens", type=int, default=600, help="largest next turn of the session (tokens)")


def select_edits(render: Renderer, sessions, kinds, count: int, max_tokens: int, turn_tokens: int,
                 per_history: int = 2) -> list[RealEdit]:
    """``count`` edits: the kinds take turns, each kind takes its sessions in turn, at most
    ``per_history`` edits of a kind per history (so more sessions are seen)."""
    queues: dict[str, list[RealEdit]] = {kind: [] for kind in kinds}
    rounds: dict[str, list[list[RealEdit]]] = {kind: [] for kind in kinds}
    for j, session in enumerate(sessions):
        for kind, h in histories(render, session, max_tokens, turn_tokens).items():
            if kind in rounds:
                rounds[kind].append(_spread(candidates(h, kind), j)[:per_history])
    for kind, per_session in rounds.items():
        for depth in range(per_history):
            queues[kind] += [c[depth] for c in per_session if depth < len(c)]
    chosen: list[RealEdit] = []
    while len(chosen) < count and any(queues.values()):
        for kind in kinds:
            if queues[kind] and len(chosen) < count:
                chosen.append(queues[kind].pop(0))
    return chosen
