"""Synthetic agent transcripts with checkable answers.

``make_transcript(seed, split)`` builds a world, a task and a worked solution:
system prompt (with the tool list from :func:`render_tools`), the user task,
assistant tool calls in the chat template's format, the tools' real outputs
(:func:`.tools.execute`) and a final answer that copies values from them.
Solutions include what agents really do and what Leyline edits: failed calls
with error outputs followed by a corrected retry, long file reads and test
logs, 1-4 tool rounds (a few more with retries), parallel calls.

Everything is a pure function of ``(seed, split)``. The train and test splits
use disjoint seed namespaces *and* disjoint entity-name pools (:mod:`.names`);
the train-side "wide" and "english" splits name their entities with made-up words and
with real words from a 2,997-word list. "custom_tool" tasks (:mod:`.custom_tools`, opt-in)
offer the caller's own tools instead of the repository's.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from leyline_runtime.text.chat_template import render_tools
from leyline_sdk.protocol import Message
from leyline_sdk.tools_prompt import tools_message

from . import names as N
from .custom_tools import make_custom_tool_task
from .task_kinds import KINDS, Play, say
from .tools import ORDER_TOOLS, TOOLS, calculator
from .world import World, make_world

SPLITS = ("train", "test", "wide", "english")  # "wide"/"english": train-side, unmemorisable names (.names)

SYSTEM_PROMPT = (
    "You are a careful agent working in a software repository. Use the tools to look things up, "
    "check every tool result, retry with a corrected call when a tool returns an error, and finish "
    "with a short answer that quotes the exact values you found."
)


def system_message(tools: list[dict] | None = None) -> Message:
    return Message(role="system", content=SYSTEM_PROMPT + "\n\n" + render_tools(tools or TOOLS))


def api_head(tools: list[dict], prompt: str) -> list[Message]:
    """How the runtime's chat routes and LangChain adapter start a prompt: the tools message
    (``leyline_sdk.tools_prompt.tools_message``), then the caller's own system prompt."""
    head = tools_message(tools)
    assert head is not None
    return [head.model_copy(update={"id": None}), Message(role="system", content=prompt)]


# Opt-in mixture knobs (``train``/``evaluate`` --order-share / --api-share). At 0 every transcript is
# what it was before they existed, so the shipped model's recipe and numbers still reproduce.
RECIPE_ORDER_SHARE = 0.12  # of the transcripts: "order" tasks (the LangGraph example's kind of task)
RECIPE_API_SHARE = 0.3  # of the others: starting the way API requests do (see :func:`api_head`)


def _needle(s: str) -> re.Pattern:
    left = r"(?<![A-Za-z0-9_.\-])" if re.match(r"-?\d", s) else r"(?<![A-Za-z0-9_])"
    right = r"(?![A-Za-z0-9_])(?!\.\d)"
    return re.compile(left + re.escape(s) + right)


@dataclass(frozen=True)
class TaskMix:
    """Which tasks :func:`make_transcript` draws when no kind is named (each share a probability)."""
    order_share: float = 0.0  # "order" tasks: the LangGraph example's kind (RECIPE_ORDER_SHARE)
    api_share: float = 0.0  # of the repository-tool tasks: the API prompt layout (RECIPE_API_SHARE)
    custom_tool_share: float = 0.0  # tasks offering the caller's own never-seen tools (.custom_tools)


@dataclass
class Task:
    task_id: str
    split: str
    kind: str
    messages: list[Message]  # system + user: what the agent starts from
    tools: list[dict]
    world: World
    expected: str  # canonical answer text
    required: list[tuple[str, ...]] = field(default_factory=list)  # each: any of these must appear
    forbidden: list[str] = field(default_factory=list)

    def check(self, answer_text: str) -> bool:
        text = answer_text or ""
        for alternatives in self.required:
            if not any(_needle(a).search(text) for a in alternatives):
                return False
        return not any(_needle(f).search(text) for f in self.forbidden)


@dataclass
class Transcript:
    tasks: list[Task]  # the first task, then follow-ups asked later in the same conversation
    messages: list[Message]  # the whole conversation, final answers included

    @property
    def task(self) -> Task:
        return self.tasks[0]

    @property
    def tool_rounds(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant" and m.tool_calls)


ORDER_PROMPTS = [
    "You are an order assistant. Use read_file and calculator; answer with the total.",
    "You are an order assistant. Use the tools and answer with the total.",
    "You help customers with their orders. Read the files you need and compute totals with the calculator.",
    "You are a billing assistant. Use read_file and calculator.",
]
ORDER_QUESTIONS = [
    "What does order #{n} in prices.csv cost with the discount and shipping from the config?",
    "How much does order #{n} (prices.csv) cost after the discount, shipping included?",
    "Compute the total of order #{n} in prices.csv: apply the configured discount, then add shipping.",
    "What is the final price of order #{n} in prices.csv (discount and shipping from the config)?",
]
_CURRENCIES = ["EUR", "USD", "GBP", "CHF"]


def _order_world(rng: random.Random, world: World, split: str) -> dict:
    """Adds ``config.ini``, ``prices.csv`` and ``notes.txt`` (an order) to the world."""
    pool = N.nouns(split)
    items = [f"{rng.choice(pool)}-{rng.randint(1, 60):02d}" for _ in range(rng.randint(2, 5))]
    prices = [f"{rng.choice([rng.randint(1, 40) + rng.choice([0.25, 0.5, 0.75, 0.0]), rng.randint(100, 4999) / 100]):.2f}"
              for _ in items]
    qty = [rng.randint(1, 6) for _ in items]
    discount = rng.choice(["0.05", "0.1", "0.15", "0.2", "0.25", "0.3"])
    shipping = rng.choice(["0", "4.5", "5", "7.5", "9.9", "12", "3.25"])
    currency = rng.choice(_CURRENCIES)
    world.files["config.ini"] = f"[order]\ncurrency = {currency}\ndiscount = {discount}\nshipping = {shipping}\n"
    world.files["prices.csv"] = "item,unit_price,quantity\n" + "".join(
        f"{i},{p},{q}\n" for i, p, q in zip(items, prices, qty))
    days = sorted(rng.sample(range(1, 29), rng.randint(3, 8)))
    world.files["notes.txt"] = "".join(f"{d}: customer asked about {rng.choice(items)}, answered by ops\n"
                                       for d in days)
    return {"items": items, "prices": prices, "qty": qty, "discount": discount, "shipping": shipping,
            "currency": currency}


def _order_transcript(rng: random.Random, world: World, split: str, seed: int) -> Transcript:
    """An "order" task: read the config and the price list, compute the total in steps.

    Like ``examples/langgraph_agent.py``: its two tools (:data:`.tools.ORDER_TOOLS`), the API
    prompt layout, a wrong first guess at the config's file name now and then, a calculator
    call per step. Item names come from the split's noun pool; all numbers are drawn per task.
    """
    o = _order_world(rng, world, split)
    messages = api_head(ORDER_TOOLS, rng.choice(ORDER_PROMPTS))
    user = rng.choice(ORDER_QUESTIONS).format(n=rng.randint(10, 999))
    messages.append(Message(role="user", content=user))
    play = Play(world, rng, messages)
    subtotal_expr = " + ".join(f"{p} * {q}" for p, q in zip(o["prices"], o["qty"]))
    subtotal = calculator(subtotal_expr)
    discounted_expr = f"{subtotal} * (1 - {o['discount']})"
    discounted = calculator(discounted_expr)
    total_expr = f"{discounted} + {o['shipping']}"
    total = calculator(total_expr)
    if rng.random() < 0.4:
        play.one(say(rng, ["First the config."]), "read_file", {"path": rng.choice(["config.txt", "config.yaml",
                                                                                    "order.ini"])})
        play.one(say(rng, ["Wrong file name; the config is config.ini."], 0.3), "read_file", {"path": "config.ini"})
    else:
        play.one(say(rng, ["First the config.", "Reading the discount and shipping."]), "read_file",
                 {"path": "config.ini"})
    play.one(say(rng, [f"Discount {o['discount']}, shipping {o['shipping']}. Now the prices."], 0.3),
             "read_file", {"path": "prices.csv"})
    play.one(say(rng, ["Subtotal: unit price times quantity, summed."], 0.4), "calculator",
             {"expression": subtotal_expr})
    if rng.random() < 0.5:
        play.one(say(rng, [f"Subtotal {subtotal}; applying the {o['discount']} discount."], 0.4), "calculator",
                 {"expression": discounted_expr})
        play.one(say(rng, [f"Adding shipping {o['shipping']}."], 0.4), "calculator", {"expression": total_expr})
    else:
        total_expr = f"{subtotal} * (1 - {o['discount']}) + {o['shipping']}"
        total = calculator(total_expr)
        play.one(say(rng, [f"Subtotal {subtotal}; applying the discount and adding shipping."], 0.4),
                 "calculator", {"expression": total_expr})
    play.answer(rng.choice([f"The order costs {total} {o['currency']}.", f"The total is {total} {o['currency']}.",
                            f"{total} {o['currency']} (subtotal {subtotal}, discount {o['discount']}, "
                            f"shipping {o['shipping']})."]))
    task = Task(task_id=f"{split}-{seed}", split=split, kind="order", messages=messages[:3], tools=ORDER_TOOLS,
                world=world, expected=total, required=[(total,)])
    return Transcript(tasks=[task], messages=play.messages)


def _custom_tool_transcript(rng: random.Random, world: World, split: str, seed: int) -> Transcript:
    """A "custom_tool" task (:mod:`.custom_tools`): the caller's own tool, run by the world."""
    made = make_custom_tool_task(rng, split)
    world.custom_tools.update({t.name: t for t in made.tools})
    task = Task(task_id=f"{split}-{seed}", split=split, kind="custom_tool", messages=list(made.messages),
                tools=[t.spec for t in made.tools], world=world, expected=made.expected,
                required=[(made.expected,)])
    return Transcript(tasks=[task], messages=made.messages + made.solution)




def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")


MAX_CHAIN_CHARS = 6300  # keeps a chained transcript within a 2048-token row


def _pick_spec(rng: random.Random, world: World, split: str, kind: str | None, seed: int):
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    for _attempt in range(50):
        chosen = kind or rng.choices(kinds, weights)[0]
        spec = KINDS[chosen][1](rng, world, split)
        if spec is not None:
            return chosen, spec
    raise RuntimeError(f"could not build a {kind} task for seed {seed}")


def _chars(messages: list[Message]) -> int:
    return sum(len(m.content) + sum(len(c.function.arguments) + 40 for c in m.tool_calls or []) + 10
               for m in messages)


def make_transcript(seed: int, split: str = "train", kind: str | None = None,
                    mix: TaskMix = TaskMix()) -> Transcript:
    """One task and its worked solution; a pure function of ``(seed, split, kind)``.

    About a third of the transcripts go on with one or two follow-up tasks in
    the same world (long, multi-task agent histories up to ~2k tokens); those
    follow-ups are in ``Transcript.tasks`` with their whole history as messages.
    """
    _check_split(split)
    rng = random.Random(f"transcript:{split}:{seed}")
    world = make_world(str(seed), split)
    # A separate stream, so adding these choices left every other transcript as it was.
    dice = random.Random(f"layout:{split}:{seed}")
    if kind == "order" or (kind is None and dice.random() < mix.order_share):
        return _order_transcript(rng, world, split, seed)
    # Drawn only when asked for, so recipes without custom tools get the same transcripts as before.
    if kind == "custom_tool" or (kind is None and mix.custom_tool_share and dice.random() < mix.custom_tool_share):
        return _custom_tool_transcript(rng, world, split, seed)
    api = dice.random() < mix.api_share
    messages = api_head(TOOLS, SYSTEM_PROMPT) if api else [system_message()]
    play = Play(world, rng, messages)
    tasks: list[Task] = []
    n_parts = 1 + (rng.choice([1, 1, 2]) if rng.random() < 0.35 else 0)
    for part in range(n_parts):
        chosen, (user, expected, required, forbidden, solve) = _pick_spec(
            rng, world, split, kind if part == 0 else None, seed)
        if part:
            user = rng.choice(["", "", "Thanks. ", "Next question: ", "Another one. ", "Now: "]) + user
        before = len(play.messages)
        play.messages.append(Message(role="user", content=user))
        task = Task(task_id=f"{split}-{seed}" + (f".{part}" if part else ""), split=split, kind=chosen,
                    messages=list(play.messages), tools=TOOLS, world=world, expected=expected,
                    required=required, forbidden=forbidden)
        solve(play)
        if part and _chars(play.messages) > MAX_CHAIN_CHARS:
            del play.messages[before:]  # too long for one row: drop this follow-up
            break
        tasks.append(task)
    return Transcript(tasks=tasks, messages=play.messages)


def make_task(seed: int, split: str = "test", kind: str | None = None, mix: TaskMix = TaskMix()) -> Task:
    return make_transcript(seed, split, kind, mix).task


