"""Tasks with the caller's own tools: tools the model has never seen, values copied from the prompt.

API and LangChain users bind their own functions (``magic_function(input: int)``,
``create_customer(customer_name, description)``), often with no system prompt and
``tool_choice`` forcing a call. The repository tasks of :mod:`.transcripts` always
offer the same five tools, so without these the model learns those names and
argument shapes only. Each task here draws a fresh tool (name, parameters, typed
schema, a hidden deterministic implementation), sometimes beside distractor tools,
and a request whose values (numbers, names in Latin or CJK script) the call must
copy. Constrained decoding guarantees an offered name and schema-valid arguments;
these teach the values.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from leyline_sdk.protocol import FunctionCall, Message, ToolCall
from leyline_sdk.tools_prompt import tools_message

from . import names as N
from .writing_systems import SCRIPT_BLOCKS, script_name

ENTITY_KINDS = ["customer", "user", "project", "team", "account", "company", "contact", "vendor"]
COMPANY_SUFFIXES = ["Group", "Labs", "GmbH", "Ltd", "Inc", "Studio", "Partners", "Co"]
LOOKUP_ATTRS = ["weather", "population", "timezone", "price", "status", "owner", "rating"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant. Use the tools when asked.",
                  "Answer with the tool results.", "You can call tools."]
# CJK names come from the whole CJK Unified Ideographs block (20,992 characters, 3 UTF-8 bytes each):
# too many to memorise, so they can only be copied byte by byte. (A first version drew from the
# block's first 2,000 only, and its model wrote characters of that range instead of copying.)


@dataclass
class CustomTool:
    spec: dict  # the OpenAI function schema, as LangChain's convert_to_openai_tool writes it
    run: Callable[[dict], str]  # the hidden implementation, given arguments valid against spec

    @property
    def name(self) -> str:
        return self.spec["function"]["name"]


def _schema(name: str, description: str, params: dict[str, str], required: list[str]) -> dict:
    props = {p: {"type": t} for p, t in params.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "properties": props, "required": required, "type": "object"}}}


def _int_value(rng: random.Random) -> int:
    return rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 9999), -rng.randint(1, 99)])


def _name_value(rng: random.Random, split: str, foreign: bool = False) -> str:
    if foreign:
        return script_name(rng)
    roll = rng.random()
    if roll < 0.3:
        return "".join(chr(rng.randint(*SCRIPT_BLOCKS["cjk"])) for _ in range(rng.randint(2, 6)))
    words = [w.capitalize() for w in rng.sample(N.nouns(split), rng.randint(1, 2))]
    if roll < 0.7:
        words.append(rng.choice(COMPANY_SUFFIXES))
    return " ".join(words)


@dataclass
class _Draft:
    tool: CustomTool
    args: dict  # the call the request asks for
    asks: list[str]  # ways to ask for it
    answers: list[str]  # final answers quoting the result
    expected: str  # what a right answer must quote


def _number_tool(rng: random.Random, split: str) -> _Draft:
    noun = rng.choice(N.nouns(split))
    name = rng.choice([f"{rng.choice(['magic', 'secret', 'mystery', 'lucky', 'special'])}_function",
                       f"{noun}_score", f"{rng.choice(N.VERBS)}_{noun}"])
    names = rng.sample(["input", "x", "n", "value", "number", "a", "b", "count"], rng.choice([1, 1, 2]))
    params = {p: "integer" for p in names}
    k, c = rng.randint(2, 9), rng.randint(-20, 20)

    def body(args: dict) -> str:
        return str(sum((k if i else 1) * args[p] for i, p in enumerate(names)) + c)

    tool = CustomTool(_schema(name, rng.choice(["Apply a magic function to an input.",
                                                f"Compute the {noun} score of the given numbers.",
                                                "Returns a number computed from the inputs."]),
                              params, names), body)
    args = {p: _int_value(rng) for p in names}
    shown = ", ".join(str(v) for v in args.values())
    keyed = " and ".join(f"{p}={v}" for p, v in args.items())
    asks = [f"What is the value of {name}({shown})? Use the tool.", f"What does {name} return for {keyed}?",
            f"Call {name} with {keyed} and tell me the result.", f"Compute {name}({shown})."]

    result = tool.run(args)
    return _Draft(tool, args, asks, [f"{name}({shown}) = {result}.", f"The value is {result}.", result], result)


def _create_tool(rng: random.Random, split: str, foreign: bool = False) -> _Draft:
    kind = rng.choice(ENTITY_KINDS)
    name = f"{rng.choice(['create', 'add', 'register'])}_{kind}"
    field_name = rng.choice([f"{kind}_name", "name"])
    with_description = rng.random() < 0.6
    params = {field_name: "string", **({"description": "string"} if with_description else {})}
    new_id = rng.randint(100, 99999)

    def body(args: dict) -> str:
        return f"Created {kind} '{args[field_name]}' with id {new_id}."

    tool = CustomTool(_schema(name, f"Create a new {kind}.", params, list(params)), body)
    value = _name_value(rng, split, foreign)
    gloss = rng.choice(N.nouns(split)).capitalize() + " " + rng.choice(COMPANY_SUFFIXES)
    glossed = [f"Create a {kind} named '{value}' ({gloss})", f"Add the {kind} \"{value}\" ({gloss})."]
    plain = [f"Create a {kind} named '{value}'.", f"Please register {value} as a new {kind}."]
    asks = glossed if rng.random() < 0.5 else plain
    # A description comes from the request when it gives one (the gloss), else it says what was asked.
    description = gloss if asks is glossed else f"New {kind} {value}"
    args = {field_name: value, **({"description": description} if with_description else {})}

    return _Draft(tool, args, asks, [f"Done: {kind} '{value}' has id {new_id}.", tool.run(args),
                                     f"Created {value} (id {new_id})."], str(new_id))


def _lookup_tool(rng: random.Random, split: str, foreign: bool = False) -> _Draft:
    attr = rng.choice(LOOKUP_ATTRS)
    name = f"get_{attr}"
    param = rng.choice(["city", "name", "item", "place"])
    params = {param: "string"}
    value = rng.choice([str(rng.randint(1, 999)), rng.choice(N.nouns(split)),
                        f"{rng.randint(10, 99)}.{rng.randint(0, 9)}"])

    def body(args: dict) -> str:
        return value

    tool = CustomTool(_schema(name, f"Get the {attr} of a {param}.", params, [param]), body)
    subject = _name_value(rng, split, foreign)
    args = {param: subject}
    asks = [f"What is the {attr} of {subject}? Use the tool.", f"Look up the {attr} for {subject}.",
            f"{subject}: what is its {attr}?"]

    return _Draft(tool, args, asks, [f"The {attr} of {subject} is {value}.", f"{value}."], value)


_FAMILIES = [_number_tool, _create_tool, _lookup_tool]
_NAMED_FAMILIES = [_create_tool, _lookup_tool]


@dataclass
class CustomToolTask:
    tools: list[CustomTool]  # all offered tools; tools[0] is the one the request needs
    messages: list[Message]  # tools message (with the tool_choice nudge), maybe a system prompt, the request
    solution: list[Message]  # the call, its result, the answer
    expected: str  # what a right answer quotes (the result, or the id a create call returned)


def make_custom_tool_task(rng: random.Random, split: str, foreign: bool = False) -> CustomToolTask:
    """One task; ``foreign``: a create or lookup call whose name is in another writing system
    (:mod:`.writing_systems`), else any family with the usual names."""
    draft = rng.choice(_NAMED_FAMILIES)(rng, split, True) if foreign else rng.choice(_FAMILIES)(rng, split)
    tool = draft.tool
    distractors = [rng.choice(_FAMILIES)(rng, split).tool for _ in range(rng.choice([0, 0, 1, 2]))]
    offered = [tool] + [d for d in distractors if d.name != tool.name]
    order = rng.sample(offered, len(offered))
    choice = rng.choice(["auto", "auto", "required", "named"])
    head = tools_message([t.spec for t in order], call=tool.name if choice == "named" else None,
                         required=choice == "required")
    assert head is not None
    messages = [head.model_copy(update={"id": None})]
    if rng.random() < 0.4:
        messages.append(Message(role="system", content=rng.choice(SYSTEM_PROMPTS)))
    messages.append(Message(role="user", content=rng.choice(draft.asks)))
    # Non-ASCII as is (not \uXXXX escapes): the call copies the name's own tokens from the request.
    call = ToolCall(id="call_0", function=FunctionCall(name=tool.name,
                                                       arguments=json.dumps(draft.args, ensure_ascii=False)))
    result = tool.run(draft.args)
    solution = [Message(role="assistant", content="", tool_calls=[call]),
                Message(role="tool", content=result, tool_call_id="call_0",
                        name=tool.name if rng.random() < 0.85 else None),
                Message(role="assistant", content=rng.choice(draft.answers))]
    return CustomToolTask(tools=offered, messages=messages, solution=solution, expected=draft.expected)
