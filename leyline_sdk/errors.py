"""One error hierarchy for the SDK and the runtime.

The runtime raises these classes and turns them into the JSON error body
``{"error": {"code": ..., "message": ...}}``; the clients turn that body back
into the same class with :func:`error_for`. Each class carries its wire
``code`` and HTTP ``status_code`` as class attributes, so ``SessionNotFound("no
such session")`` is all the runtime has to write.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "ERROR_CLASSES",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "CapacityExceeded",
    "InvalidBody",
    "InvalidDirective",
    "InvalidSpan",
    "LeylineError",
    "OverlappingSpans",
    "RequestTimeout",
    "RequestTooLarge",
    "SessionNotFound",
    "Unauthorized",
    "ValidationFailed",
    "VersionConflict",
    "error_for",
]


class _ClassDefault:
    """Marker for "use the class's own status code" (``None`` means client-side)."""

    def __repr__(self) -> str:
        return "<class default>"


_CLASS_DEFAULT: Final = _ClassDefault()


class LeylineError(Exception):
    """Base class of every SDK error.

    Two families, as in openai-python: :class:`APIStatusError` (the runtime
    answered with an error status) and :class:`APIConnectionError` (no HTTP
    response). ``status_code`` is ``None`` for errors raised on the client side.
    """

    code: str = "leyline_error"
    status_code: int | None = None

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        status_code: int | None | _ClassDefault = _CLASS_DEFAULT,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        if not isinstance(status_code, _ClassDefault):
            self.status_code = status_code

    def to_body(self) -> dict[str, Any]:
        """The wire error body the runtime sends for this error."""
        return {"error": {"code": self.code, "message": self.message}}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status_code={self.status_code!r}, "
            f"message={self.message!r})"
        )


class APIStatusError(LeylineError):
    """Base of every error that came (or would come) with an HTTP status, as openai-python's.

    ``except APIStatusError`` catches every error the runtime answers with; an unknown
    code (or a malformed response) is raised as this class itself. A request
    rejected by the client's own validation before it is sent is a
    :class:`ValidationFailed` with ``status_code`` ``None``.
    """

    code = "api_error"


class Unauthorized(APIStatusError):
    code = "unauthorized"
    status_code = 401


class SessionNotFound(APIStatusError):
    code = "session_not_found"
    status_code = 404


class VersionConflict(APIStatusError):
    code = "version_conflict"
    status_code = 409


class CapacityExceeded(APIStatusError):
    code = "capacity_exceeded"
    status_code = 413


class InvalidDirective(APIStatusError):
    code = "invalid_directive"
    status_code = 422


class InvalidSpan(InvalidDirective):
    code = "invalid_span"


class OverlappingSpans(InvalidDirective):
    code = "overlapping_spans"


class ValidationFailed(APIStatusError):
    code = "validation_error"
    status_code = 422


class RequestTooLarge(APIStatusError):
    """A request over one of the server's limits (body, message size, message count, tokens)."""

    code = "request_too_large"
    status_code = 413


class InvalidBody(APIStatusError):
    """The body is not parseable JSON (invalid UTF-8, bad syntax, nested too deep)."""

    code = "invalid_body"
    status_code = 400


class RequestTimeout(APIStatusError):
    """The client did not send its request body within the server's body timeout."""

    code = "request_timeout"
    status_code = 408


class APIConnectionError(LeylineError):
    """The request did not get an HTTP response (refused, reset, DNS, ...)."""

    code = "connection_error"


class APITimeoutError(APIConnectionError):
    code = "timeout"


ERROR_CLASSES: Final[dict[str, type[LeylineError]]] = {
    cls.code: cls
    for cls in (
        Unauthorized,
        SessionNotFound,
        VersionConflict,
        CapacityExceeded,
        InvalidDirective,
        InvalidSpan,
        OverlappingSpans,
        ValidationFailed,
        RequestTooLarge,
        InvalidBody,
        RequestTimeout,
        APIConnectionError,
        APITimeoutError,
    )
}


def error_for(code: str, message: str, status: int | None) -> LeylineError:
    """The error for a wire ``code``; unknown codes become :class:`APIStatusError`.

    ``status`` is stored as given: the HTTP status the error came with, or
    ``None`` for an error raised without a response.
    """
    cls = ERROR_CLASSES.get(code, APIStatusError)
    return cls(message, code=code, status_code=status)
