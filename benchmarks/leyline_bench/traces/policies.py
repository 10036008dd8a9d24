"""The history-editing policies agent frameworks apply, as the history each model call sends.

A policy is asked, at each model call of a session in order, for the history to send given the
*raw* history (every message the session holds so far, nothing edited): ``policy.sent(raw)``.
Parameters are the frameworks' documented ones, their token sizes scaled by ``cap / 200_000``
(the defaults were written for a 200k-token context; ``cap`` is the replay's context budget):

* ``append_only``: the raw history (what mini-swe-agent itself sent).
* ``langchain_clear``: LangChain's own ``ClearToolUsesEdit`` (``langchain.agents.middleware``),
  run as ``ContextEditingMiddleware.wrap_model_call`` runs it: on a copy of the agent state's
  messages (the system prompt is apart, as ``create_agent`` keeps it), at every call, with its
  default token counter (``count_tokens_approximately``). Defaults: trigger 100,000 (scaled),
  keep 3, clear_at_least 0, placeholder ``[cleared]``.
* ``langchain_summarize``: LangChain's own ``SummarizationMiddleware.before_model`` on a state that
  persists across calls (its edit replaces the state, as LangGraph's reducer applies it), trigger
  ``("tokens", 4000)`` and ``keep=("messages", 20)`` (the documented example; 4000 is left as it
  is: it already sits at half of an 8k budget), default token counter. The sessions carry no
  summaries, so the summary text comes from a ``summarizer`` callable (the middleware's own hook):
  the first ``SUMMARY_CHARS`` characters of the messages it was handed, as ``get_buffer_string``
  writes them — a fixed-length extract, not a model's summary.
* ``ten_line_truncation``: every tool output but the newest that has more than 10 lines is cut
  to its first 5 and last 5 lines with a marker line between (``[... N lines truncated ...]``):
  the agent reads each output whole once, then it is cut.
* ``anthropic_clear``: Anthropic's ``clear_tool_uses_20250919`` as the bundled runtime's
  ``context_management`` applies it (``leyline_runtime.api.context_edits.clear_tool_uses``,
  the same function, counting with the runtime's tokenizer as the server does). Parameters: the
  documented example (trigger 30,000 input tokens, keep 3 tool uses, clear_at_least 5,000),
  scaled. The bundled runtime arm sends the raw history with ``context_management`` and the
  server edits it; every other arm sends this client-side copy of the same edit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from leyline_sdk.protocol import Message

POLICIES = ("langchain_clear", "anthropic_clear", "ten_line_truncation", "langchain_summarize", "append_only")
REFERENCE_CONTEXT = 200_000  # the context the frameworks' default sizes were written for (Claude's)
CLEAR_TRIGGER = 100_000  # ClearToolUsesEdit's default trigger
ANTHROPIC_TRIGGER, ANTHROPIC_CLEAR_AT_LEAST = 30_000, 5_000  # Anthropic's documented example
SUMMARY_TRIGGER, SUMMARY_KEEP = 4000, 20  # SummarizationMiddleware's documented example
SUMMARY_CHARS = 1200
TRUNCATE_MIN_LINES, TRUNCATE_HEAD, TRUNCATE_TAIL = 10, 5, 5


def scaled(tokens: int, cap: int) -> int:
    return max(1, round(tokens * cap / REFERENCE_CONTEXT))


# -- Leyline messages <-> LangChain messages -------------------------------------------------------

class LangChainView:
    """Converts a session's messages to LangChain's and back; an unchanged message comes back as the
    very object it was (no re-serialised tool arguments, nothing that would render differently)."""

    def __init__(self):
        self.originals: dict[str, Message] = {}
        self.count = 0

    def to_langchain(self, message: Message):
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

        self.count += 1
        key = f"m{self.count}"
        self.originals[key] = message
        if message.role == "assistant":
            calls = [{"name": c.function.name, "args": json.loads(c.function.arguments or "{}"), "id": c.id,
                      "type": "tool_call"} for c in message.tool_calls or []]
            return AIMessage(content=message.content, tool_calls=calls, id=key)
        if message.role == "tool":
            return ToolMessage(content=message.content, tool_call_id=message.tool_call_id or "", id=key)
        cls = SystemMessage if message.role == "system" else HumanMessage
        return cls(content=message.content, id=key)

    def from_langchain(self, lc) -> Message:
        original = self.originals.get(lc.id or "")
        if original is not None:
            if lc.content == original.content:
                return original
            return original.model_copy(update={"content": lc.content})  # a cleared tool output
        role = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}[lc.type]
        made = Message(role=role, content=lc.content)  # a summary the middleware wrote
        self.count += 1
        lc.id = f"made{self.count}"
        self.originals[lc.id] = made
        return made


def split_system(raw: list[Message]) -> tuple[list[Message], list[Message]]:
    """``create_agent`` keeps the system prompt apart from the state's messages."""
    head = 1 if raw and raw[0].role == "system" else 0
    return raw[:head], raw[head:]


# -- the policies -------------------------------------------------------------------------------------

class AppendOnly:
    name = "append_only"
    context_management: dict | None = None

    def reset(self) -> None:
        pass

    def sent(self, raw: list[Message]) -> list[Message]:
        return list(raw)


class LangChainClear(AppendOnly):
    """``ContextEditingMiddleware(edits=[ClearToolUsesEdit(...)])``: stateless, applied at every call."""

    name = "langchain_clear"

    def __init__(self, cap: int):
        from langchain.agents.middleware import ClearToolUsesEdit

        self.edit = ClearToolUsesEdit(trigger=scaled(CLEAR_TRIGGER, cap), keep=3, clear_at_least=0)
        self.parameters = {"trigger": self.edit.trigger, "keep": self.edit.keep,
                           "clear_at_least": self.edit.clear_at_least, "placeholder": self.edit.placeholder,
                           "token_counter": "count_tokens_approximately (the middleware's default)"}

    def sent(self, raw: list[Message]) -> list[Message]:
        from langchain_core.messages.utils import count_tokens_approximately

        system, rest = split_system(raw)
        view = LangChainView()
        messages = [view.to_langchain(m) for m in rest]
        self.edit.apply(messages, count_tokens=count_tokens_approximately)
        return system + [view.from_langchain(m) for m in messages]


class LangChainSummarize(AppendOnly):
    """``SummarizationMiddleware``: its ``before_model`` edits the agent state, which persists."""

    name = "langchain_summarize"

    def __init__(self):
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.language_models.fake_chat_models import FakeListChatModel

        # the model is only asked for its profile (none: absolute sizes) and never called: the summarizer replaces it
        self.middleware = SummarizationMiddleware(FakeListChatModel(responses=["unused"]),
                                                  trigger=("tokens", SUMMARY_TRIGGER),
                                                  keep=("messages", SUMMARY_KEEP), summarizer=fixed_extract)
        self.parameters = {"trigger": ["tokens", SUMMARY_TRIGGER], "keep": ["messages", SUMMARY_KEEP],
                           "summary": f"the first {SUMMARY_CHARS} characters of the messages handed to the "
                                      "summarizer (get_buffer_string)",
                           "token_counter": "count_tokens_approximately (the middleware's default)"}
        self.reset()

    def reset(self) -> None:
        self.view = LangChainView()
        self.state: list = []
        self.absorbed = 0  # raw messages (after the system prompt) already in the state

    def sent(self, raw: list[Message]) -> list[Message]:
        system, rest = split_system(raw)
        self.state += [self.view.to_langchain(m) for m in rest[self.absorbed:]]
        self.absorbed = len(rest)
        update = self.middleware.before_model({"messages": self.state}, None)
        if update is not None:
            self.state = list(update["messages"][1:])  # [RemoveMessage(REMOVE_ALL), summary, *kept]
        return system + [self.view.from_langchain(m) for m in self.state]


def fixed_extract(messages: list) -> str:
    from langchain_core.messages import get_buffer_string

    return get_buffer_string(messages)[:SUMMARY_CHARS]


class TenLineTruncation(AppendOnly):
    name = "ten_line_truncation"
    parameters = {"rule": f"every tool output but the newest with more than {TRUNCATE_MIN_LINES} lines is cut to its "
                          f"first {TRUNCATE_HEAD} and last {TRUNCATE_TAIL} lines, a marker line between"}

    def sent(self, raw: list[Message]) -> list[Message]:
        tools = [i for i, m in enumerate(raw) if m.role == "tool"]
        out = list(raw)
        for i in tools[:-1]:
            out[i] = truncated(raw[i])
        return out


def truncated(message: Message) -> Message:
    lines = message.content.split("\n")
    if len(lines) <= TRUNCATE_MIN_LINES:
        return message
    cut = len(lines) - TRUNCATE_HEAD - TRUNCATE_TAIL
    kept = lines[:TRUNCATE_HEAD] + [f"[... {cut} lines truncated ...]"] + lines[-TRUNCATE_TAIL:]
    return message.model_copy(update={"content": "\n".join(kept)})


class AnthropicClear(AppendOnly):
    """``clear_tool_uses_20250919``, the bundled runtime's implementation, applied client-side for the
    arms that have no ``context_management``; ``context_management`` is the same edit for the server."""

    name = "anthropic_clear"

    def __init__(self, cap: int):
        from leyline_runtime.api.chat_request import ContextManagement
        from leyline_runtime.text.tokenizer import ChatTokenizer

        from leyline_testkit.tiny_models import runtime_tokenizer_file

        self.context_management = {"edits": [{
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": scaled(ANTHROPIC_TRIGGER, cap)},
            "keep": {"type": "tool_uses", "value": 3},
            "clear_at_least": {"type": "input_tokens", "value": scaled(ANTHROPIC_CLEAR_AT_LEAST, cap)}}]}
        self.management = ContextManagement.model_validate(self.context_management)
        self.tokenizer = ChatTokenizer.from_file(runtime_tokenizer_file())
        self.parameters = {**self.context_management["edits"][0],
                           "token_counter": "the bundled runtime's tokenizer (the server counts with it)"}

    def sent(self, raw: list[Message]) -> list[Message]:
        from leyline_runtime.api.context_edits import apply_edits

        return apply_edits(self.management, list(raw), self.tokenizer)[0]


def make_policy(name: str, cap: int):
    makers: dict[str, Callable[[], AppendOnly]] = {
        "append_only": AppendOnly, "langchain_clear": lambda: LangChainClear(cap),
        "langchain_summarize": LangChainSummarize, "ten_line_truncation": TenLineTruncation,
        "anthropic_clear": lambda: AnthropicClear(cap)}
    if name not in makers:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return makers[name]()


def parameters(policy) -> dict:
    return dict(getattr(policy, "parameters", {}))
