"""Wire protocol shared by the SDK and the runtime (pydantic v2, no torch).

A *directive* is the 4-tuple ``(session, span, replacement, mode)`` of
DESIGN.md. A :class:`DirectiveBatch` addresses the session as it was before
the batch, like a patch: spans are half-open, must not overlap, and the whole
batch applies atomically.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from .errors import VersionConflict
from .json_numbers import JSON_SAFE_INT, JsonModel

Role = Literal["system", "user", "assistant", "tool"]
# "auto": the runtime chooses amortize, amortize + tail repair, or forget from a measured
# drift signal (see DirectiveOutcome.auto).
Mode = Literal["amortize", "forget", "auto"]
# shrink: content the agent no longer needs (cleared, truncated, summarised); erase: content that must stop
# influencing the model (a result replaced by a corrected one, a retracted answer, a secret)
Intent = Literal["shrink", "erase"]
AppliedMode = Literal["amortize", "forget"]
AutoChoice = Literal["amortize", "repair", "forget"]
SpanUnit = Literal["message", "token"]

MAX_ID_LENGTH = 128
# Session ids travel in URL paths: one path segment of unreserved characters,
# starting with a letter or digit (so never "." or ".."). 1-128 characters.
SESSION_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_ID_LENGTH - 1}}}$"
SESSION_ID_RULE = f"1-{MAX_ID_LENGTH} characters of A-Z a-z 0-9 . _ : @ -, starting with a letter or digit"
# Sent by the SDK on every request about one session: a router pins the session's replica by it
# (docs/vllm.md, Replicas); a session-bound chat may name its session by it instead of the body.
SESSION_HEADER = "X-Leyline-Session"
# Sent by the SDK with a create that rebuilds a session the server lost (the reason): servers count it.
REBUILD_HEADER = "X-Leyline-Rebuild"
# JSON's exact integer range (RFC 7493), inside torch.Generator.manual_seed's [-2**63, 2**64).
MIN_SEED, MAX_SEED = -JSON_SAFE_INT, JSON_SAFE_INT
# Directives one batch may carry; a history edit that needs more rebuilds the session
# (leyline_sdk.batch_plan.plan_batch says so, for every caller alike).
MAX_DIRECTIVES = 1024


def _encodable(text: str) -> str:
    """Text must be valid Unicode: a lone UTF-16 surrogate (JSON ``"\\ud800"``) cannot be encoded."""
    if text.isascii():  # O(1) in CPython: nothing to check in a large ASCII text
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode (lone surrogate at character {exc.start})") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]
SessionId = Annotated[str, Field(pattern=SESSION_ID_PATTERN, min_length=1, max_length=MAX_ID_LENGTH,
                                 description=SESSION_ID_RULE)]


class FunctionCall(BaseModel):
    name: Text = Field(min_length=1, max_length=256)
    # JSON text, as the OpenAI wire format carries it.
    arguments: Text = "{}"


class ToolCall(BaseModel):
    id: Text = Field(min_length=1, max_length=MAX_ID_LENGTH)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message. ``id`` is ours (LangGraph ids); it never changes what renders."""

    model_config = ConfigDict(extra="ignore")

    role: Role
    content: Text = ""
    id: Text | None = Field(default=None, max_length=MAX_ID_LENGTH)
    name: Text | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = Field(default=None, max_length=MAX_ID_LENGTH)

    @model_validator(mode="before")
    @classmethod
    def _null_content_only_beside_tool_calls(cls, data: Any) -> Any:
        # OpenAI allows null content on an assistant message that makes tool calls, and nowhere else
        if isinstance(data, dict) and "content" in data and data["content"] is None:
            if data.get("role") != "assistant" or not data.get("tool_calls"):
                raise ValueError("content may be null only on an assistant message with tool_calls")
        return data

    @field_validator("content", mode="before")
    @classmethod
    def _content_text(cls, value: Any) -> Any:
        # null (beside tool calls, above) and lists of text parts normalise to plain text
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


class Span(JsonModel):
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


class Directive(JsonModel):
    """Replace ``span`` by ``replacement``.

    Message unit: ``replacement`` is a list of messages. Token unit: text or a
    list of token ids, and the span must stay inside one message's content.
    An empty replacement deletes; ``start == end`` inserts.
    """

    span: Span
    replacement: list[Message] | Text | list[int] = Field(default_factory=list)
    mode: Mode = "amortize"
    intent: Intent = Field("shrink", description=(
        "`shrink`: content the agent no longer needs (cleared, truncated, summarised), applied in `mode`. "
        "`erase`: content that must stop influencing the model (a corrected result, a retracted answer, a "
        "secret): what follows the span is recomputed, whatever `mode` asks (`fallback_reason` `erase`)."))

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


class DirectiveBatch(JsonModel):
    session_id: SessionId
    directives: list[Directive] = Field(min_length=1, max_length=MAX_DIRECTIVES)
    expected_version: int | None = Field(default=None, ge=0)


class AutoDecision(BaseModel):
    """What ``mode: "auto"`` chose for one directive, and the signal it chose by.

    ``choice``: ``amortize`` (splice only), ``repair`` (splice, then recompute the last
    ``repaired_tokens`` rows, which the next turn attends to most) or ``forget``.
    ``reason``: ``short_tail`` (few tokens follow the edit: forget costs about as much as a
    repair), ``signal`` (the drift signal crossed a threshold), ``below_threshold``,
    ``after_forget`` (an earlier directive of the batch already recomputes this one) or
    ``unsupported_runtime`` (amortize is not possible here: this engine cannot rotate the model's cache),
    the words of ``leyline_runtime/outcome_rule.py``; vLLM adds ``not_measured``.
    """

    choice: AutoChoice
    reason: str
    # Mean relative change of the layer-1 cache rows just after the edit when layer 0 is
    # recomputed over the edited history (0: amortize is exact there); None when not measured.
    layer1_change: float | None = None
    # Share of layer-0 attention that the session's newest positions (standing in for the next
    # turn) put on the edit and the rows the signal measured; None when not measured.
    attention: float | None = None
    signal_tokens: int = 0  # positions the signal was measured on (one layer each)
    repaired_tokens: int = 0  # tail rows recomputed after the splice
    # The session's accumulated drift after this directive (the sum of its amortized auto
    # edits' layer1_change x (num_layers - 1)) and, when that passed the drift budget, the
    # rows re-prefilled from the earliest drifted position (then drift is 0).
    session_drift: float = 0.0
    drift_repair_tokens: int = 0


class DirectiveOutcome(BaseModel):
    requested_mode: Mode
    intent: Intent = "shrink"  # the directive's own
    applied_mode: AppliedMode
    fallback_reason: str | None = None
    # Token span in the session as it was before the batch, after token-level
    # minimisation, and the position shift it causes for what follows.
    token_start: int
    token_end: int
    delta: int
    reused_tokens: int = 0
    rotated_tokens: int = 0
    recomputed_tokens: int = 0  # replacement, forget and repair rows in this directive's region
    auto: AutoDecision | None = None  # requested_mode "auto" only


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


class DriftInfo(BaseModel):
    """Accumulated amortize drift of a session's ``auto`` edits against its drift budget."""

    drift: float = 0.0  # sum of the per-edit signals since the last exact recompute
    budget: float | None = None  # None: no budget (never repaired for drift)
    earliest_position: int | None = None  # first token whose rows may carry drift
    repairs: int = 0  # budget repairs so far
    repaired_tokens: int = 0  # rows they re-prefilled


class SessionCreate(JsonModel):
    session_id: SessionId | None = None
    messages: list[Message] = Field(default_factory=list)


class SessionInfo(BaseModel):
    session_id: str
    version: int
    num_tokens: int
    num_messages: int
    segments: list[Segment]
    counters: SessionCounters
    drift: DriftInfo = Field(default_factory=DriftInfo)
    messages: list[Message] | None = None


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class AppendRequest(JsonModel):
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


class SamplingParams(JsonModel):
    max_tokens: int = Field(default=256, ge=1, le=8192)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    stop: list[Text] | Text | None = None
    logprobs: StrictBool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    min_tokens: int = Field(default=0, ge=0, le=8192,
                            description="The end of the message cannot be sampled before this many tokens "
                                        "(vLLM's min_tokens; stop strings still apply)")

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        return self

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
    parallel_tool_calls: StrictBool = True
    response_format: dict[str, Any] | None = Field(
        default=None, description="OpenAI's response_format: json_object or json_schema")
    stream: StrictBool = Field(
        default=False, description="Answer with server-sent events: `delta` events with the text as it is "
                                   "generated, then one `done` event carrying the GenerateResponse")


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


def check_version(session_id: str, version: int, expected: int | None) -> None:
    """The ``expected_version`` guard every backend applies: a mismatch is a 409 :class:`VersionConflict`."""
    if expected is not None and expected != version:
        raise VersionConflict(f"session {session_id} is at version {version}, not {expected}")
