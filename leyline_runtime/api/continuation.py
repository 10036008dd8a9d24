"""Which held session a request that names none continues: the rule, written once for every engine.

Anthropic's Messages API is stateless: a client (Claude Code, the ``anthropic`` SDK, ``ChatAnthropic``)
sends its whole history on every call and names no session. A request without ``X-Leyline-Session`` is
bound to the session whose history it continues, so the turn edits and appends where it would
otherwise prefill everything again:

* **The key** is the history *as the client sends it*: the request's prompt messages (tools message
  first, then the translated messages) before any server-side edit, and after the turn, that history
  plus the reply as the client will send it back. The next request continues the session when its
  prompt messages *start with* that key, message for message. Not the session's tokens: what the
  session holds is the history after this server's ``context_management`` edits (cleared tool
  results, amortized rows), which the client never sees, so once an edit was made the client's
  history would never be a token prefix of the session it continues; and a message boundary is the
  unit the turn's diff works in anyway (a token prefix could end inside a message).
* **The cost**: one hash chain over the request's messages (SHA-256 of each message's canonical JSON,
  chained) and one dictionary look-up per message, under one lock; no tokenising, no scan over
  sessions (about 2 ms for a 400-message, 460 KB history on a busy 2-core Xeon). The index keeps one
  entry per session (a 32-byte digest and the id), at most :data:`DEFAULT_CAPACITY` (the least
  recently recorded forgotten first).
* **The scope**: the caller's tenant (its API key), and what the client says of itself where it says
  it (``metadata.user_id``; Claude Code's ``x-claude-code-session-id`` header), seed the chain, so a
  digest of one tenant can never match another's request; and sessions are the tenant's own in the
  runtime anyway (another tenant's session id names nothing).
* **One request at a time**: :meth:`ContinuationIndex.claim` takes the entry out, so a second request
  continuing the same history meanwhile (a client's parallel calls) gets a session of its own instead
  of editing the first's under it; :meth:`ContinuationIndex.record` puts the new key in after the turn,
  :meth:`ContinuationIndex.restore` the old one back when the turn failed.
  :meth:`ContinuationIndex.continuing` is the three around one turn, for a sync or an async caller.
* **A miss** (a first call, a history the client edited itself, a session this server never held or
  forgot after a restart): a new session, built from the request. Nothing is wrong; only the prompt is
  computed again. A hit on a session the cache evicted meanwhile is rebuilt under the same id
  (``rebuild_reason: evicted``).
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from leyline_sdk.protocol import Message

DEFAULT_CAPACITY = 65536  # sessions the index remembers (a 32-byte digest and an id each: a few MiB at most)
SESSION_PREFIX = "continued_"  # the ids of sessions this rule creates


@dataclass(frozen=True)
class Scope:
    """Who may continue whose sessions: a tenant, narrowed to one user of it and one client session of
    that user when the client names them."""

    tenant: str
    user: str | None = None
    client_session: str | None = None

    def seed(self) -> bytes:
        return hashlib.sha256(repr((self.tenant, self.user, self.client_session)).encode()).digest()


@dataclass(frozen=True)
class Claim:
    """A session found for a request: its id, and the key it was found under (to put back on failure)."""

    session_id: str
    key: bytes
    matched: int  # the request's leading messages the session's history covers


@dataclass
class Continuation:
    """One request's binding (:meth:`ContinuationIndex.continuing`): the session it runs on, and the reply
    as its client will send it back, once the turn has one."""

    session_id: str
    reply: Message | None = None


def _message_bytes(message: Message) -> bytes:
    # what renders, not Leyline's own message id (clients never send it)
    return message.model_dump_json(exclude={"id"}).encode()


def _chained(key: bytes, message: Message) -> bytes:
    return hashlib.sha256(key + hashlib.sha256(_message_bytes(message)).digest()).digest()


def history_keys(scope: Scope, messages: list[Message]) -> list[bytes]:
    """The key of each prefix of ``messages`` in ``scope``: ``keys[i]`` covers ``messages[:i + 1]``."""
    keys, key = [], scope.seed()
    for message in messages:
        key = _chained(key, message)
        keys.append(key)
    return keys


def new_session_id() -> str:
    return f"{SESSION_PREFIX}{uuid.uuid4().hex}"


class ContinuationIndex:
    """History keys -> the held session whose whole history (as its client sends it) each one is."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._sessions: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, scope: Scope, messages: list[Message]) -> Claim | None:
        """The session whose history is the longest prefix of ``messages`` in ``scope``, taken out of the
        index until :meth:`record` or :meth:`restore`; None: no held session's history is one (a miss)."""
        return self._claim(history_keys(scope, messages))

    def _claim(self, keys: list[bytes]) -> Claim | None:
        with self._lock:
            for matched in range(len(keys), 0, -1):
                session_id = self._sessions.pop(keys[matched - 1], None)
                if session_id is not None:
                    return Claim(session_id, keys[matched - 1], matched)
        return None

    @contextmanager
    def continuing(self, scope: Scope, history: list[Message]) -> Iterator[Continuation]:
        """Run one turn on the held session ``history`` continues, or on a new one: the block runs it on
        ``session_id`` and sets ``reply``; then the session is found by ``history`` and that reply. A block
        that raises, or sets no reply, puts a claimed session back under its old key."""
        keys = history_keys(scope, history)  # once: the reply's key extends the history's
        claim = self._claim(keys)
        bound = Continuation(claim.session_id if claim else new_session_id())
        try:
            yield bound
        finally:
            if bound.reply is not None:
                self._put(_chained(keys[-1] if keys else scope.seed(), bound.reply), bound.session_id)
            elif claim is not None:
                self.restore(claim)

    def record(self, scope: Scope, history: list[Message], session_id: str) -> None:
        """``session_id`` now holds ``history`` (the request's messages and the reply, as the client will
        send them back)."""
        if history:
            self._put(history_keys(scope, history)[-1], session_id)

    def restore(self, claim: Claim) -> None:
        """The claimed turn failed: its session is found under its old key again."""
        self._put(claim.key, claim.session_id)

    def _put(self, key: bytes, session_id: str) -> None:
        with self._lock:
            self._sessions[key] = session_id
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)

    def __len__(self) -> int:
        return len(self._sessions)
