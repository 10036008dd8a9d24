"""Which mode an edit should run in.

A :data:`ModePolicy` looks at one edit of the history and answers
``"amortize"`` (cheap in-place splice; what follows keeps the old span's
influence) or ``"forget"`` (re-prefill from the edit on; the old span leaves
no trace). :func:`default_policy` amortizes housekeeping (cleared or truncated
tool outputs, dropped tool attempts, insertions) and forgets content the
conversation should no longer be conditioned on (retracted answers, user
corrections, changed instructions). :func:`auto_policy` keeps those forget
rules and answers ``"auto"`` for the rest: the runtime then measures the
edit's drift and picks amortize, amortize + tail repair, or forget itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .protocol import Intent, Message, Mode

__all__ = [
    "EditContext",
    "EditReason",
    "IntentPolicy",
    "ModePolicy",
    "auto_policy",
    "default_policy",
    "edit_intent",
    "explain_edit",
    "force_mode",
]

# The rule that decided an edit's mode. explain_edit answers all but "rerun": LeylineMemory's name for a
# user_correction or retraction of turns an earlier run of the thread left in a session it adopted
# (CallStats.edits); it is forgotten all the same.
EditReason = Literal[
    "instruction_edit",
    "user_correction",
    "retraction",
    "rerun",
    "tool_output_edit",
    "tool_attempt_edit",
    "insertion",
    "other",
]


@dataclass(frozen=True)
class EditContext:
    """One edit: ``old_messages`` (``old[start:end]``) become ``new_messages``."""

    old_messages: Sequence[Message]
    new_messages: Sequence[Message]
    start: int
    total_messages: int

    @property
    def end(self) -> int:
        return self.start + len(self.old_messages)

    @property
    def kind(self) -> Literal["insert", "delete", "replace"]:
        if not self.old_messages:
            return "insert"
        if not self.new_messages:
            return "delete"
        return "replace"

    def changed_old(self) -> list[Message]:
        """Old messages whose rendering does not survive the edit.

        An id-only change, or a message carried over verbatim inside a larger
        replacement, renders the same and so does not count.
        """
        kept = {m.fingerprint() for m in self.new_messages}
        return [m for m in self.old_messages if m.fingerprint() not in kept]

    def added_new(self) -> list[Message]:
        """New messages that render differently from everything they replace."""
        before = {m.fingerprint() for m in self.old_messages}
        return [m for m in self.new_messages if m.fingerprint() not in before]


ModePolicy = Callable[[EditContext], Mode]
IntentPolicy = Callable[[EditContext], Intent]


def explain_edit(edit: EditContext) -> tuple[Mode, EditReason]:
    """The default policy's answer with the rule that decided it.

    Forget rules are checked first: an edit that both drops a tool attempt and
    removes a user message is a user correction.
    """
    changed = edit.changed_old()
    added = edit.added_new()
    # Instructions condition everything after them; an amortized edit would
    # leave the old instructions' influence in every later token.
    if any(m.role == "system" for m in changed) or any(m.role == "system" for m in added):
        return "forget", "instruction_edit"
    if any(m.role == "user" for m in changed):
        return "forget", "user_correction"
    if any(_is_plain_answer(m) for m in changed):
        return "forget", "retraction"
    if changed and all(m.role == "tool" for m in changed) and _same_calls(changed, added):
        return "amortize", "tool_output_edit"
    if changed and all(m.role in ("assistant", "tool") for m in changed):
        # Only tool-call messages and tool results are left (plain answers were
        # handled above): a failed attempt dropped, or its inputs cleared.
        return "amortize", "tool_attempt_edit"
    if edit.kind == "insert":
        return "amortize", "insertion"
    return "amortize", "other"


def edit_intent(edit: EditContext) -> Intent:
    """The SDK's reading of an edit: ``erase`` where content is replaced by other content that must take
    its place (a retracted answer or a user's message rewritten, changed instructions, a tool result
    replaced by a corrected one: not a truncation of it, not a ``[placeholder]``); ``shrink`` for the
    rest: messages dropped or inserted, several folded into fewer (a summary), a result cleared or
    truncated. A guess from the text: a redaction that only shortens reads as a shrink, so say
    ``intent="erase"`` yourself there. Opt in with ``split_append(..., intent=edit_intent)``: the
    engines recompute after an erase whatever the mode (``Directive.intent``), so it is not the
    default, which keeps every edit a shrink."""
    if edit.kind != "replace" or len(edit.new_messages) < len(edit.old_messages):
        return "shrink"
    reason = explain_edit(edit)[1]
    if reason in ("instruction_edit", "user_correction", "retraction"):
        return "erase"
    if reason == "tool_output_edit" and _corrected(edit.changed_old(), edit.added_new()):
        return "erase"
    return "shrink"


def default_policy(edit: EditContext) -> Mode:
    """Amortize housekeeping, forget retractions, user corrections and instruction edits."""
    return explain_edit(edit)[0]


def auto_policy(edit: EditContext) -> Mode:
    """Forget what the default policy forgets; let the runtime decide (``"auto"``) the rest."""
    mode = explain_edit(edit)[0]
    return "forget" if mode == "forget" else "auto"


def force_mode(mode: Mode) -> ModePolicy:
    """A policy that always answers ``mode``."""
    if mode not in ("amortize", "forget", "auto"):
        raise ValueError(f"mode must be 'amortize', 'forget' or 'auto', not {mode!r}")

    def policy(edit: EditContext) -> Mode:
        return mode

    policy.__name__ = f"force_{mode}"
    return policy


def _is_plain_answer(message: Message) -> bool:
    return message.role == "assistant" and not message.tool_calls


def _same_calls(old_tools: Sequence[Message], new_messages: Sequence[Message]) -> bool:
    """Every changed tool result is still answered, by a result of the same call or id.

    That is a cleared or truncated output, not a dropped one.
    """
    new_tools = [m for m in new_messages if m.role == "tool"]
    for old in old_tools:
        if not any(_same_call(old, new) for new in new_tools):
            return False
    return True


def _same_call(old: Message, new: Message) -> bool:
    if old.id is not None and old.id == new.id:
        return True
    return old.tool_call_id is not None and old.tool_call_id == new.tool_call_id


def _corrected(old_tools: Sequence[Message], new_messages: Sequence[Message]) -> bool:
    """Some result was replaced by other content of the same call: neither a truncation nor a placeholder."""
    return any(_same_call(old, new) and not _shortened(old.content or "", new.content or "")
               for old in old_tools for new in new_messages if new.role == "tool")


def _shortened(old: str, new: str) -> bool:
    """``new`` only shortens ``old``: a ``[placeholder]``, or a cut of it (a marker after the cut allowed)."""
    text = new.strip()
    if text.startswith("[") and text.endswith("]"):
        return True
    kept = text.rstrip(" .…[]()").split("\n")[0][:40]
    return bool(kept) and len(text) <= len(old) and old.startswith(kept)
