"""OpenAI chat-completions request and response models, plus Leyline's extras.

Only what the runtime honours is declared; other OpenAI fields the official
clients may send (``user``, penalties, ``parallel_tool_calls`` ...) are
accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leyline_sdk.protocol import (
    DirectiveOutcome,
    Message,
    Mode,
    SessionId,
    TokenLogprob,
    ToolCall,
)

# --- request --------------------------------------------------------------------------


class FunctionSpec(BaseModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str = Field(min_length=1, max_length=256)


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class StreamOptions(BaseModel):
    include_usage: bool = False


class LeylineOptions(BaseModel):
    """How a session-bound request's edits are applied."""

    mode: Mode = "amortize"


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    session_id: SessionId | None = Field(
        default=None,
        description="Bind the request to a session (also: header X-Leyline-Session). The runtime diffs "
                    "`messages` against the session's history and applies the edits as directives.")
    leyline: LeylineOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice is supported")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None

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

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        if self.tool_choice in ("required",) and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self


# --- response -------------------------------------------------------------------------


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class LeylineReport(BaseModel):
    """What the runtime did with the request's history (Leyline extension)."""

    session_id: str | None = Field(description="The bound session; null for a stateless request")
    version: int | None = Field(description="The session's version after the completion")
    versions: list[int] = Field(default_factory=list,
                                description="Every session version this request produced, in order (its edits, "
                                            "its appended messages, the reply); empty for a stateless request")
    rebuilt: bool = Field(description="The session did not exist (new or evicted) and was built from the request")
    directives_applied: int = 0
    outcomes: list[DirectiveOutcome] = Field(default_factory=list)
    appended_messages: int = 0
    prefilled_tokens: int = Field(description="Prompt tokens computed for this request (the rest came from cache)")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
    leyline: LeylineReport


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "leyline"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    durability: Literal["memory", "snapshot"] = Field(
        description="`memory`: sessions are a cache and a restart loses them; `snapshot`: their message "
                    "histories are saved on shutdown and prefilled again at start (`--state-dir`)")
