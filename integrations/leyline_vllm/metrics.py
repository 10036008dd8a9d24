"""What one replica's plugin counts, served on vLLM's own ``/metrics`` (Prometheus).

Behind a session-affinity router (docs/vllm.md, Replicas) every replica holds only the sessions
routed to it, so these are per replica: the sessions it holds, the ones it created and rebuilt
(by reason), the requests naming a session it does not hold (404: first contact after a re-hash,
a restart), the directives it executed and the prompt tokens behind them. Read at scrape time from
the service; one API-server process (vLLM's multi-process metrics registry is not fed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from leyline_sdk.protocol import SessionCounters

# The reasons a rebuild may be counted under (the SDK's X-Leyline-Rebuild values and the bound chat's
# own); anything else a client sends is counted as "other", so a client cannot grow the label set.
REBUILD_REASONS = frozenset({"session_not_found", "invalid_directive", "too_many_edits", "unknown_session"})


@dataclass
class ReplicaStats:
    created: int = 0
    rebuilds: Counter[str] = field(default_factory=Counter)
    not_found: int = 0
    directives: int = 0
    retired: SessionCounters = field(default_factory=SessionCounters)  # token counters of deleted sessions

    def rebuilt(self, reason: str) -> None:
        self.rebuilds[reason if reason in REBUILD_REASONS else "other"] += 1

    def retire(self, counters: SessionCounters) -> None:
        for name in SessionCounters.model_fields:
            setattr(self.retired, name, getattr(self.retired, name) + getattr(counters, name))


class LeylineCollector:
    """A Prometheus collector over a :class:`~leyline_vllm.service.LeylineService`."""

    def __init__(self, service) -> None:
        self.service = service

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        service, stats = self.service, self.service.stats
        sessions = list(service.sessions.values())
        yield GaugeMetricFamily("leyline_sessions_live", "Sessions this replica holds", value=len(sessions))
        yield CounterMetricFamily("leyline_sessions_created", "Sessions this replica created (rebuilds included)",
                                  value=stats.created)
        rebuilds = CounterMetricFamily("leyline_session_rebuilds", "Sessions rebuilt here from a request's full "
                                       "history, by reason", labels=["reason"])
        for reason in sorted(REBUILD_REASONS | set(stats.rebuilds)):
            rebuilds.add_metric([reason], stats.rebuilds[reason])
        yield rebuilds
        yield CounterMetricFamily("leyline_session_not_found", "Requests naming a session this replica does not "
                                  "hold (404)", value=stats.not_found)
        yield CounterMetricFamily("leyline_directives", "Directives executed on this replica", value=stats.directives)
        for kind in ("prefilled", "reused", "rotated", "recomputed"):
            name = f"{kind}_tokens"
            total = getattr(stats.retired, name) + sum(getattr(s.counters, name) for s in sessions)
            yield CounterMetricFamily(f"leyline_prompt_tokens_{kind}", f"Prompt tokens {kind} by Leyline's sessions",
                                      value=total)


def register_collector(service) -> None:
    """Serve the service's counters on vLLM's ``/metrics`` (its registry, as vLLM picks it)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    get_prometheus_registry().register(LeylineCollector(service))
