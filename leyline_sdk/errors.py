"""One error hierarchy for the SDK and the runtime.

The runtime raises these classes and turns them into the JSON error body
``{"error": {"code": ..., "message": ...}}``; the clients turn that body back
into the same class with :func:`error_for`. Each class carries its wire
``code`` and HTTP ``status_code`` as class attributes, so ``SessionNotFound("no
such session")`` is all the runtime has to write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the runtime raises these classes without ever holding an httpx response
    import httpx

__all__ = [
    "ERROR_CLASSES",
    "STATUS_CLASSES",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "CapacityExceeded",
    "ConflictError",
    "InvalidBody",
    "InvalidDirective",
    "InvalidSpan",
    "LeylineError",
    "OverlappingSpans",
    "RequestTimeout",
    "RequestTooLarge",
    "SessionExists",
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
    code (or a malformed response) is raised as the class for its status (:func:`error_for`).
    A request rejected by the client's own validation before it is sent is a
    :class:`ValidationFailed` with ``status_code`` ``None``.

    An error built from an answer carries it, as openai-python's do: ``response`` (the
    ``httpx.Response``), ``request`` (the ``httpx.Request`` it answered) and ``body`` (the
    decoded JSON body, else its text; for an error event inside a stream, that event's
    ``error`` object). All three are ``None`` for an error raised without an answer.
    """

    code = "api_error"

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        status_code: int | None | _ClassDefault = _CLASS_DEFAULT,
        response: httpx.Response | None = None,
        body: object | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=status_code)
        self.response = response
        self.body = body

    @property
    def request(self) -> httpx.Request | None:
        return self.response.request if self.response is not None else None


class Unauthorized(APIStatusError):
    code = "unauthorized"
    status_code = 401


class SessionNotFound(APIStatusError):
    code = "session_not_found"
    status_code = 404


class ConflictError(APIStatusError):
    """409: the request conflicts with the session's current state; nothing changed.

    ``except ConflictError`` catches :class:`VersionConflict` and :class:`SessionExists`
    (and a 409 with a code this SDK does not know)."""

    code = "conflict"
    status_code = 409


class VersionConflict(ConflictError):
    """``expected_version`` is not the session's version."""

    code = "version_conflict"


class SessionExists(ConflictError):
    """A session with this id exists already (create it under another id, or use it)."""

    code = "session_exists"


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
        ConflictError,
        VersionConflict,
        SessionExists,
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


# A code this SDK does not know (a newer server, a proxy, a framework's default body) still
# says something through its status: a 409 is a conflict whatever its code.
STATUS_CLASSES: Final[dict[int, type[APIStatusError]]] = {
    401: Unauthorized,
    409: ConflictError,
    422: ValidationFailed,
}


def error_for(
    code: str | None,
    message: str,
    status: int | None,
    *,
    response: httpx.Response | None = None,
    body: object | None = None,
) -> LeylineError:
    """The error for a wire ``code``, else for its HTTP ``status``, else :class:`APIStatusError`.

    ``code`` ``None`` (a body without one) takes the status class's code, else
    ``"http_error"``. ``status`` is stored as given: the HTTP status the error came
    with, or ``None`` for an error raised without a response. ``response`` and ``body``
    are kept on a status error (see :class:`APIStatusError`).
    """
    cls = ERROR_CLASSES.get(code or "") or STATUS_CLASSES.get(status or 0, APIStatusError)
    wire_code = code or (cls.code if cls is not APIStatusError else "http_error")
    if issubclass(cls, APIStatusError):
        return cls(message, code=wire_code, status_code=status, response=response, body=body)
    return cls(message, code=wire_code, status_code=status)
