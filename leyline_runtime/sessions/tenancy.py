"""Tenants sharing one KV cache: fair shares for eviction, per-tenant counters.

Every tenant that holds sessions is entitled to an equal share of the cache
(``num_blocks // tenants``, the requester counted). When a request needs
room, idle sessions are evicted least recently used first, the requester's
own included, but a session of *another* tenant only while that tenant holds
more than its share. So one tenant's load can take back what another holds
beyond its share, never what is within it: it gets 413 instead. With one
tenant (no API keys) this is plain LRU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from leyline_runtime.sessions.session import Session


@dataclass
class TenantStats:
    prefilled_tokens: int = 0
    reused_tokens: int = 0
    rotated_tokens: int = 0
    recomputed_tokens: int = 0
    evictions: int = 0  # this tenant's sessions evicted


@dataclass
class RuntimeStats(TenantStats):
    """The same counters for the whole runtime (every tenant), and its drift-budget repairs."""

    drift_repairs: int = 0  # drift-budget re-prefills, all sessions
    drift_repaired_tokens: int = 0


class Tenancy:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.stats: dict[str, TenantStats] = {}

    def stats_of(self, tenant: str) -> TenantStats:
        return self.stats.setdefault(tenant, TenantStats())

    @staticmethod
    def usage(sessions: Iterable[Session]) -> Counter[str]:
        """Cache blocks held per tenant."""
        held: Counter[str] = Counter()
        for s in sessions:
            held[s.tenant] += len(s.table.blocks)
        return held

    def share(self, usage: Counter[str], requester: str) -> int:
        tenants = set(usage) | {requester}
        return self.num_blocks // len(tenants)

    def victims(self, sessions: Iterable[Session], requester: Session) -> Iterator[Session]:
        """Idle sessions that ``requester`` may evict, least recently used first (evict them in this order)."""
        sessions = list(sessions)
        usage = self.usage(sessions)
        share = self.share(usage, requester.tenant)
        idle = sorted((s for s in sessions if s.busy == 0 and s is not requester), key=lambda s: s.last_used)
        for victim in idle:
            if victim.tenant != requester.tenant and usage[victim.tenant] <= share:
                continue  # within its share: not ours to take
            usage[victim.tenant] -= len(victim.table.blocks)
            yield victim
