"""Wire protocol shared by the SDK and the runtime (pydantic v2, no torch).

A *directive* is the 4-tuple ``(session, span, replacement, mode)`` of
DESIGN.md. A :class:`DirectiveBatch` addresses the session as it was before
the batch, like a patch: spans are half-open, must not overlap, and the whole
batch applies atomically.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "user", "assistant", "tool"]
Mode = Literal["amortize", "forget"]
SpanUnit = Literal["message", "token"]

MAX_ID_LENGTH = 128


class FunctionCall(BaseModel):
    name: str = Field(min_length=1, max_length=256)
    # JSON text, as the OpenAI wire format carries it.
    arguments: str = "{}"


class ToolCall(BaseModel):
    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message. ``id`` is ours (LangGraph ids); it never changes what renders."""

    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str = ""
    id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)

    @field_validator("content", mode="before")
    @classmethod
    def _content_text(cls, value: Any) -> Any:
        # OpenAI allows null content on assistant tool-call messages and lists of
        # text parts; both normalise to plain text.
        if value is None:
            return ""
        if isinstance(value, list):
            parts = []
            for part in value:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ValueError("only text content parts are supported")
                parts.append(str(part.get("text", "")))
            return "".join(parts)
        return value

    @field_validator("tool_calls")
    @classmethod
    def _empty_tool_calls_is_none(cls, value: list[ToolCall] | None) -> list[ToolCall] | None:
        return value or None

    @model_validator(mode="after")
    def _role_fields(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return self

    def fingerprint(self) -> tuple:
        """What renders: two messages with equal fingerprints render to equal tokens."""
        calls = tuple(
            (c.id, c.function.name, c.function.arguments) for c in (self.tool_calls or [])
        )
        return (self.role, self.content, calls, self.tool_call_id, self.name)


class Span(BaseModel):
    """Half-open ``[start, end)`` over messages (default) or over token ids."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    unit: SpanUnit = "message"

    @model_validator(mode="after")
    def _ordered(self) -> "Span":
        if self.end < self.start:
            raise ValueError(f"span end {self.end} is before start {self.start}")
        return self

    def overlaps(self, other: "Span") -> bool:
        if self.unit != other.unit:
            return False
        if self.start == self.end and other.start == other.end:
            return self.start == other.start  # two insertions at one point: order unknown
        if self.start == self.end:
            return other.start < self.start < other.end
        if other.start == other.end:
            return self.start < other.start < self.end
        return max(self.start, other.start) < min(self.end, other.end)


class Directive(BaseModel):
    """Replace ``span`` by ``replacement``.

    Message unit: ``replacement`` is a list of messages. Token unit: text or a
    list of token ids, and the span must stay inside one message's content.
    An empty replacement deletes; ``start == end`` inserts.
    """

    span: Span
    replacement: list[Message] | str | list[int] = Field(default_factory=list)
    mode: Mode = "amortize"

    @model_validator(mode="after")
    def _replacement_kind(self) -> "Directive":
        rep = self.replacement
        if self.span.unit == "message":
            if isinstance(rep, str):
                raise ValueError("a message span takes a list of messages as replacement, not text")
            if rep and not all(isinstance(m, Message) for m in rep):
                raise ValueError("a message span takes a list of messages as replacement")
        else:
            if isinstance(rep, list) and rep and not all(isinstance(t, int) for t in rep):
                raise ValueError("a token span takes text or token ids as replacement")
            if isinstance(rep, list) and any(isinstance(t, int) and t < 0 for t in rep):
                raise ValueError("token ids must be non-negative")
        return self


class DirectiveBatch(BaseModel):
    session_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    directives: list[Directive] = Field(min_length=1, max_length=1024)
    expected_version: int | None = Field(default=None, ge=0)


class DirectiveOutcome(BaseModel):
    requested_mode: Mode
    applied_mode: Mode
    fallback_reason: str | None = None
    # Token span in the session as it was before the batch, after token-level
    # minimisation, and the position shift it causes for what follows.
    token_start: int
    token_end: int
    delta: int
    reused_tokens: int = 0
    rotated_tokens: int = 0
    recomputed_tokens: int = 0


class DirectiveResult(BaseModel):
    session_id: str
    version: int
    num_tokens: int
    num_messages: int
    outcomes: list[DirectiveOutcome]
    elapsed_ms: float


# --- sessions -----------------------------------------------------------------


class Segment(BaseModel):
    index: int
    message_id: str | None
    role: Role
    start: int
    end: int


class SessionCounters(BaseModel):
    prefilled_tokens: int = 0
    reused_tokens: int = 0
    rotated_tokens: int = 0
    recomputed_tokens: int = 0


class SessionCreate(BaseModel):
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    messages: list[Message] = Field(default_factory=list)


class SessionInfo(BaseModel):
    session_id: str
    version: int
    num_tokens: int
    num_messages: int
    segments: list[Segment]
    counters: SessionCounters
    messages: list[Message] | None = None


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class AppendRequest(BaseModel):
    messages: list[Message] = Field(min_length=1)
    expected_version: int | None = Field(default=None, ge=0)


class Usage(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


class AppendResult(BaseModel):
    session_id: str
    version: int
    num_tokens: int
    num_messages: int
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class SamplingParams(BaseModel):
    max_tokens: int = Field(default=256, ge=1, le=8192)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: list[str] | str | None = None
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]


class GenerateRequest(SamplingParams):
    messages: list[Message] = Field(default_factory=list)
    expected_version: int | None = Field(default=None, ge=0)
    # Constrained decoding, in OpenAI's shapes (checked by the runtime). Omitted: free text.
    tools: list[dict[str, Any]] | None = Field(
        default=None, max_length=128,
        description="OpenAI function tools: a tool call can only name one of these, with arguments valid "
                    "against its schema; [] forbids tool calls. The prompt's tools message is the caller's.")
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = Field(
        default=None, description="OpenAI's response_format: json_object or json_schema")


class GenerateResponse(BaseModel):
    session_id: str
    message: Message
    finish_reason: Literal["stop", "length", "tool_calls"]
    usage: Usage
    logprobs: list[TokenLogprob] | None = None
    version: int


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
