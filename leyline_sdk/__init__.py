"""Leyline SDK: edit an agent's conversation history without a full KV re-prefill.

Light by design: needs only pydantic and httpx (never torch).

    from leyline_sdk import LeylineClient, split_append

    with LeylineClient() as client:
        info = client.create_session(history)
        edits, tail = split_append(history, edited_history)
        if edits:
            client.apply(info.session_id, edits, expected_version=info.version)
        reply = client.generate(info.session_id, tail)
"""

from .version import __version__
from .client import AsyncLeylineClient, LeylineClient
from .diff import apply_directives, diff_messages, split_append
from .errors import (
    ERROR_CLASSES,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    CapacityExceeded,
    InvalidDirective,
    InvalidSpan,
    LeylineError,
    OverlappingSpans,
    SessionNotFound,
    Unauthorized,
    ValidationFailed,
    VersionConflict,
    error_for,
)
from .memory import TOOLS_MESSAGE_ID, CallStats, EditRecord, LeylineMemory, ThreadStats
from .policy import (
    EditContext,
    EditReason,
    ModePolicy,
    default_policy,
    explain_edit,
    force_mode,
)
from .protocol import (
    AppendRequest,
    AppendResult,
    Directive,
    DirectiveBatch,
    DirectiveOutcome,
    DirectiveResult,
    ErrorBody,
    ErrorDetail,
    FunctionCall,
    GenerateRequest,
    GenerateResponse,
    Message,
    Mode,
    Role,
    SamplingParams,
    Segment,
    SessionCounters,
    SessionCreate,
    SessionInfo,
    SessionList,
    Span,
    SpanUnit,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
)

__all__ = [
    "ERROR_CLASSES",
    "TOOLS_MESSAGE_ID",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AppendRequest",
    "AppendResult",
    "AsyncLeylineClient",
    "CallStats",
    "CapacityExceeded",
    "Directive",
    "DirectiveBatch",
    "DirectiveOutcome",
    "DirectiveResult",
    "EditContext",
    "EditReason",
    "EditRecord",
    "ErrorBody",
    "ErrorDetail",
    "FunctionCall",
    "GenerateRequest",
    "GenerateResponse",
    "InvalidDirective",
    "InvalidSpan",
    "LeylineClient",
    "LeylineError",
    "LeylineMemory",
    "Message",
    "Mode",
    "ModePolicy",
    "OverlappingSpans",
    "Role",
    "SamplingParams",
    "Segment",
    "SessionCounters",
    "SessionCreate",
    "SessionInfo",
    "SessionList",
    "SessionNotFound",
    "Span",
    "SpanUnit",
    "ThreadStats",
    "TokenLogprob",
    "ToolCall",
    "TopLogprob",
    "Unauthorized",
    "Usage",
    "ValidationFailed",
    "VersionConflict",
    "__version__",
    "apply_directives",
    "default_policy",
    "diff_messages",
    "error_for",
    "explain_edit",
    "force_mode",
    "split_append",
]
