"""The OpenAI chat-completions request, with Leyline's extras: one set of fields, limits and defaults.

Both engines parse a chat request with this model (the bundled runtime for every chat, the vLLM
plugin for a session-bound one), so a field means the same on both. Every field declared here is
honoured, or is a documented no-op (``user``, ``metadata``, ``prompt_cache_key``,
``safety_identifier``: nothing here depends on who asks, and Leyline's cache is keyed by session, not
by a hint), or is refused by an engine that cannot honour it, with a 400 naming it
(:data:`~leyline_runtime.api.chat.OPTIONAL_FEATURES`). Any other field is rejected with a 400 naming
it, so nothing is silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from leyline_sdk.json_numbers import JsonModel
from leyline_sdk.protocol import MAX_SEED, MIN_SEED, Message, Mode, SessionId

DEFAULT_MAX_TOKENS = 256  # a chat request without max_tokens / max_completion_tokens
TOKEN_ID_KEY_PATTERN = r"^(0|[1-9][0-9]{0,8})$"  # a logit_bias key: a token id in decimal
MAX_NEW_TOKENS = 8192  # max_tokens, max_completion_tokens and min_tokens at most
MAX_STOP_STRINGS = 4  # OpenAI's limit; each string any length
# field -> the switch it needs on (refused otherwise, as OpenAI does, rather than ignored)
NEEDS_SWITCH = {"top_logprobs": "logprobs", "stream_options": "stream"}


class FunctionSpec(JsonModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(JsonModel):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(JsonModel):
    name: str = Field(min_length=1, max_length=256)


class NamedToolChoice(JsonModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(JsonModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = Field(default=None, description="Decoding always follows the schema, strict or not")


class ResponseFormatText(JsonModel):
    type: Literal["text"]


class ResponseFormatJsonObject(JsonModel):
    type: Literal["json_object"]


class ResponseFormatJsonSchema(JsonModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
                           Field(discriminator="type")]


class InputTokens(JsonModel):
    type: Literal["input_tokens"] = "input_tokens"
    value: int = Field(ge=0)


class ToolUses(JsonModel):
    type: Literal["tool_uses"] = "tool_uses"
    value: int = Field(ge=0)


class ClearToolUses(JsonModel):
    """Anthropic's ``clear_tool_uses_20250919`` edit: clear old tool results (and inputs)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["clear_tool_uses_20250919"] = "clear_tool_uses_20250919"
    trigger: Annotated[InputTokens | ToolUses, Field(discriminator="type")] = InputTokens(value=100_000)
    keep: ToolUses = ToolUses(value=3)
    clear_at_least: InputTokens | None = None
    exclude_tools: list[str] = Field(default_factory=list, max_length=128)
    clear_tool_inputs: StrictBool = False


class ContextManagement(JsonModel):
    """Edits the server makes to the history before generating (Anthropic's convention).

    Bound to a session, an edit becomes an amortize directive: the cache behind the
    cleared tool results is kept, where a prefix cache would lose it.
    """

    model_config = ConfigDict(extra="forbid")

    edits: list[ClearToolUses] = Field(max_length=8)


class AppliedEdit(BaseModel):
    """One ``context_management`` edit the server made (reported in the response)."""

    type: Literal["clear_tool_uses_20250919"] = "clear_tool_uses_20250919"
    cleared_tool_uses: int
    cleared_input_tokens: int


class StreamOptions(JsonModel):
    include_usage: StrictBool = False


class LeylineOptions(JsonModel):
    """How a session-bound request's edits are applied."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = "amortize"


class DecodingFields(JsonModel):
    """What constrains or biases the choice of tokens (shared with the native generate route)."""

    model_config = ConfigDict(extra="forbid")

    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool = Field(default=True, description="false: at most one tool call per reply")
    response_format: ResponseFormat | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024,
                                                description="token id -> bias in [-100, 100]")


class ChatCompletionRequest(DecodingFields):
    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    session_id: SessionId | None = Field(
        default=None,
        description="Bind the request to a session (also: header X-Leyline-Session). The server diffs "
                    "`messages` against the session's history and applies the edits as directives.")
    leyline: LeylineOptions | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice is supported")
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    min_tokens: int | None = Field(default=None, ge=0, le=MAX_NEW_TOKENS,
                                   description="vLLM's extension: the reply cannot end before this many tokens "
                                               "(at most max_tokens)")
    context_management: ContextManagement | None = None
    # documented no-ops
    user: str | None = Field(default=None, max_length=256, description="Accepted; not used")
    metadata: dict[str, str] | None = Field(default=None, max_length=16, description="Accepted; not used")
    prompt_cache_key: str | None = Field(default=None, max_length=256,
                                         description="Accepted; not used (the cache follows `session_id`)")
    safety_identifier: str | None = Field(default=None, max_length=256, description="Accepted; not used")
    store: Literal[False] | None = Field(default=None, description="Nothing is stored; only false is accepted")

    @field_validator("store", mode="before")
    @classmethod
    def _store_is_a_boolean(cls, value: Any) -> Any:
        # the schema says false or null: pydantic's lax mode would take 0 (or "false") for false
        if value is not None and not isinstance(value, bool):
            raise ValueError("store must be false or null (nothing is stored)")
        return value

    @property
    def effective_max_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    @property
    def edit_mode(self) -> Mode:
        """The mode of every directive a bound request's edits become."""
        return self.leyline.mode if self.leyline else "amortize"

    @model_validator(mode="after")
    def _min_within_max(self) -> ChatCompletionRequest:
        if (self.min_tokens or 0) > self.effective_max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.effective_max_tokens})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _developer_is_system(cls, data: Any) -> Any:
        # OpenAI's newer "developer" role is the system role of older models.
        if isinstance(data, dict) and isinstance(data.get("messages"), list):
            data = dict(data)
            data["messages"] = [
                {**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m
                for m in data["messages"]
            ]
        return data
