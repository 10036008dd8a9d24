"""One lock per session, alive only while someone holds or waits for it.

The runtime takes it for every call on a session; the HTTP service takes the
same lock around a chat turn's several calls (or a route's one), which is why
it is re-entrant: the calls inside a held turn take it again. There is no
other per-session lock.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager


class KeyedLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.RLock, int]] = {}

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        lock = self._acquire_entry(key)
        try:
            with lock:
                yield
        finally:
            self._release_entry(key)

    def _acquire_entry(self, key: Hashable) -> threading.RLock:
        with self._guard:
            lock, users = self._locks.get(key) or (threading.RLock(), 0)
            self._locks[key] = (lock, users + 1)
            return lock

    def _release_entry(self, key: Hashable) -> None:
        with self._guard:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
