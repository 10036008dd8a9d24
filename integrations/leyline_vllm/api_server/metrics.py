"""What one replica's plugin counts, served on vLLM's own ``/metrics`` (Prometheus).

Behind a session-affinity router (docs/vllm.md, Replicas) every replica holds only the sessions
routed to it, so these are per replica: the sessions it holds, the ones it created and rebuilt
(by reason), the requests naming a session it does not hold (404: first contact after a re-hash,
a restart), the directives it executed and the prompt tokens behind them, and where the sessions'
rows live: blocks held in vLLM's paged cache (and their bytes), the host tier's bytes, holds released
by reason, loads that fell back to computing rows by reason. The residency gauges are as the
replica's last Leyline request finished (the scheduler, which owns them, reports on each request).
Read at scrape time from the service; one API-server process (vLLM's multi-process metrics registry
is not fed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from leyline_sdk.protocol import SessionCounters

from ..kv.wire import RELEASE_REASONS

# The reasons a rebuild may be counted under (the SDK's X-Leyline-Rebuild values and the bound chat's
# own); anything else a client sends is counted as "other", so a client cannot grow the label set.
REBUILD_REASONS = frozenset({"session_not_found", "invalid_directive", "too_many_edits", "unknown_session"})
# A load's fallback reasons, by the kind before their ':' (the rest names the key or the error).
FALLBACK_KINDS = frozenset({"hold_released", "kv_load_failed", "report_missing"})


@dataclass
class ReplicaStats:
    created: int = 0
    rebuilds: Counter[str] = field(default_factory=Counter)
    not_found: int = 0
    directives: int = 0
    retired: SessionCounters = field(default_factory=SessionCounters)  # token counters of deleted sessions
    residency: dict = field(default_factory=dict)  # the connector's last report (request_params.LoadReport)
    fallbacks: Counter[str] = field(default_factory=Counter)

    def observe(self, report) -> None:
        """One finished Leyline request's connector report."""
        if report.residency is not None:
            self.residency = report.residency
        if report.fallback:
            kind = report.fallback.split(":", 1)[0]
            self.fallbacks[kind if kind in FALLBACK_KINDS else "other"] += 1

    def rebuilt(self, reason: str) -> None:
        self.rebuilds[reason if reason in REBUILD_REASONS else "other"] += 1

    def retire(self, counters: SessionCounters) -> None:
        for name in SessionCounters.model_fields:
            setattr(self.retired, name, getattr(self.retired, name) + getattr(counters, name))


class LeylineCollector:
    """A Prometheus collector over a :class:`~leyline_vllm.api_server.service.LeylineService`."""

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
        residency = stats.residency
        yield GaugeMetricFamily("leyline_held_blocks", "KV blocks of vLLM's paged cache held for sessions between "
                                "their turns", value=residency.get("held_blocks", 0))
        yield GaugeMetricFamily("leyline_held_bytes", "Bytes of those held blocks",
                                value=residency.get("held_bytes", 0))
        yield GaugeMetricFamily("leyline_host_tier_bytes", "Host memory holding copies of released holds",
                                value=residency.get("host_tier_bytes", 0))
        yield CounterMetricFamily("leyline_host_tier_loads", "Row copies served from the host tier (released holds "
                                  "not recomputed)", value=residency.get("host_tier_loads", 0))
        releases = CounterMetricFamily("leyline_hold_releases", "Holds released, by reason", labels=["reason"])
        for reason, n in sorted({**dict.fromkeys(RELEASE_REASONS, 0), **residency.get("releases", {})}.items()):
            releases.add_metric([reason], n)
        yield releases
        fallbacks = CounterMetricFamily("leyline_load_fallbacks", "Loads that fell back to computing rows, by reason",
                                        labels=["reason"])
        for reason in sorted(FALLBACK_KINDS | set(stats.fallbacks)):
            fallbacks.add_metric([reason], stats.fallbacks[reason])
        yield fallbacks


def register_collector(service) -> None:
    """Serve the service's counters on vLLM's ``/metrics`` (its registry, as vLLM picks it)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    get_prometheus_registry().register(LeylineCollector(service))
