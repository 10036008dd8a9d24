"""How a streamed (``text/event-stream``) answer is documented: the schema of one event.

A client reading the document (and schemathesis, which validates each event of a stream against the
media type's schema) sees an event as an object: ``data``, one JSON object as text (``[DONE]`` ends an
OpenAI stream), and ``event`` where the stream names its events.
"""

from __future__ import annotations

from typing import Any

SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"},
    "data": {"type": "string", "description": "one JSON object as text (an OpenAI stream ends with `[DONE]`)"},
    "id": {"type": "string"},
    "retry": {"type": "integer", "minimum": 0},
}}


def sse_content(example: str) -> dict[str, Any]:
    """An OpenAPI ``content`` entry for a route that may answer with a stream of events."""
    return {"text/event-stream": {"schema": SSE_EVENT, "example": example}}
