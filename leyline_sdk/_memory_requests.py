"""The client calls a :class:`~._memory_flow.SyncFlow` asks for, one small class per call.

The flow is sans-I/O: it yields one of these and gets the answer (or the error) back. Each knows
the one client method it stands for and calls it by name, on the sync client (:meth:`send`) or the
async one (:meth:`asend`), so a reader (and a type checker) goes from a step of the flow straight to
the endpoint. :class:`Generate` can also be streamed (:meth:`Generate.stream`,
:meth:`Generate.astream`). The drivers (:mod:`._memory_drivers`) only decide which of these to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._streaming import AsyncStream, Stream
from .client import AsyncLeylineClient, LeylineClient
from .protocol import AppendResult, Directive, DirectiveResult, GenerateResponse, Message, SessionInfo

__all__ = ["Append", "ApplyDirectives", "CreateSession", "DeleteSession", "Generate", "GetSession",
           "SessionRequest"]


@dataclass(frozen=True)
class GetSession:
    """Read the session (its messages too with ``include_messages``)."""

    session_id: str
    include_messages: bool = False

    def send(self, client: LeylineClient) -> SessionInfo:
        return client.get_session(self.session_id, include_messages=self.include_messages)

    async def asend(self, client: AsyncLeylineClient) -> SessionInfo:
        return await client.get_session(self.session_id, include_messages=self.include_messages)


@dataclass(frozen=True)
class CreateSession:
    """Build the session from ``messages``; ``rebuild_reason`` names why, when it replaces a lost one."""

    session_id: str
    messages: Sequence[Message]
    rebuild_reason: str | None = None

    # A first build is the plain create_session(messages, session_id=...) call: clients that wrap or
    # subclass it with that signature keep working; only a rebuild passes its reason.

    def send(self, client: LeylineClient) -> SessionInfo:
        if self.rebuild_reason is None:
            return client.create_session(self.messages, session_id=self.session_id)
        return client.create_session(self.messages, session_id=self.session_id, rebuild_reason=self.rebuild_reason)

    async def asend(self, client: AsyncLeylineClient) -> SessionInfo:
        if self.rebuild_reason is None:
            return await client.create_session(self.messages, session_id=self.session_id)
        return await client.create_session(self.messages, session_id=self.session_id,
                                           rebuild_reason=self.rebuild_reason)


@dataclass(frozen=True)
class DeleteSession:
    session_id: str

    def send(self, client: LeylineClient) -> None:
        client.delete_session(self.session_id)

    async def asend(self, client: AsyncLeylineClient) -> None:
        await client.delete_session(self.session_id)


@dataclass(frozen=True)
class ApplyDirectives:
    """One atomic directive batch, guarded by ``expected_version``."""

    session_id: str
    directives: Sequence[Directive]
    expected_version: int | None

    def send(self, client: LeylineClient) -> DirectiveResult:
        return client.apply(self.session_id, self.directives, expected_version=self.expected_version)

    async def asend(self, client: AsyncLeylineClient) -> DirectiveResult:
        return await client.apply(self.session_id, self.directives, expected_version=self.expected_version)


@dataclass(frozen=True)
class Append:
    session_id: str
    messages: Sequence[Message]
    expected_version: int | None

    def send(self, client: LeylineClient) -> AppendResult:
        return client.append(self.session_id, self.messages, expected_version=self.expected_version)

    async def asend(self, client: AsyncLeylineClient) -> AppendResult:
        return await client.append(self.session_id, self.messages, expected_version=self.expected_version)


@dataclass(frozen=True)
class Generate:
    """Append ``messages`` and generate the next assistant message; whole, or streamed."""

    session_id: str
    messages: Sequence[Message]
    expected_version: int | None
    sampling: Mapping[str, Any] = field(default_factory=dict)

    def send(self, client: LeylineClient) -> GenerateResponse:
        return client.generate(self.session_id, self.messages, expected_version=self.expected_version,
                               **self.sampling)

    async def asend(self, client: AsyncLeylineClient) -> GenerateResponse:
        return await client.generate(self.session_id, self.messages, expected_version=self.expected_version,
                                     **self.sampling)

    def stream(self, client: LeylineClient) -> Stream:
        return client.generate_stream(self.session_id, self.messages, expected_version=self.expected_version,
                                      **self.sampling)

    def astream(self, client: AsyncLeylineClient) -> AsyncStream:
        return client.generate_stream(self.session_id, self.messages, expected_version=self.expected_version,
                                      **self.sampling)


# Everything a flow may yield; the answer it gets back is what that call's send() returns.
SessionRequest = GetSession | CreateSession | DeleteSession | ApplyDirectives | Append | Generate
