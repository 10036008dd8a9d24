"""Prometheus metrics of one service instance.

Each app gets its own :class:`CollectorRegistry`, so several apps (tests,
benchmarks) can live in one process. Token and cache figures are read from
the runtime at scrape time; directive and completion figures are counted by
the HTTP layer as requests finish. Per-tenant series carry a ``tenant``
label; :meth:`ServiceMetrics.render` for one tenant keeps only that tenant's
series, so a tenant never sees another's load (an admin key sees all).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from leyline_sdk.protocol import DirectiveResult

from .runtime import DEFAULT_TENANT, Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Directive batches run from sub-millisecond splices to multi-second re-prefills.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RuntimeCollector(Collector):
    """Token counters, sessions and cache occupancy, straight from the runtime."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        stats, pool = self.runtime.stats, self.runtime.pool
        for kind, help_text in (
            ("prefilled", "Prompt tokens computed by prefill"),
            ("reused", "Prompt tokens served from the cache unchanged"),
            ("rotated", "Prompt tokens kept from the cache with their rope keys rotated (amortize)"),
            ("recomputed", "Prompt tokens recomputed by directives (replacements and forget)"),
        ):
            yield CounterMetricFamily(f"leyline_prompt_tokens_{kind}", help_text,
                                      value=getattr(stats, f"{kind}_tokens"))
        yield CounterMetricFamily("leyline_evictions", "Idle sessions evicted to make room",
                                  value=stats.evictions)
        yield CounterMetricFamily("leyline_drift_repairs", "Re-prefills of a session whose auto edits "
                                  "passed the drift budget", value=stats.drift_repairs)
        yield CounterMetricFamily("leyline_drift_repaired_tokens", "Tokens re-prefilled by drift repairs",
                                  value=stats.drift_repaired_tokens)
        budget = self.runtime.config.auto.drift_budget
        yield GaugeMetricFamily("leyline_drift_budget", "Per-session drift budget of auto edits (-1: none)",
                                value=-1.0 if budget is None else budget)
        yield GaugeMetricFamily("leyline_session_drift_max", "Largest accumulated drift of a live session",
                                value=self.runtime.max_session_drift())
        yield GaugeMetricFamily("leyline_sessions_live", "Sessions in the cache, all tenants",
                                value=self.runtime.session_count())
        yield GaugeMetricFamily("leyline_cache_blocks_used", "KV cache blocks in use", value=pool.num_used)
        yield GaugeMetricFamily("leyline_cache_blocks_free", "KV cache blocks free", value=pool.num_free)
        yield GaugeMetricFamily("leyline_cache_block_tokens", "Tokens per KV cache block",
                                value=pool.block_size)
        yield from self._engine()
        yield from self._per_tenant()

    def _engine(self) -> Iterator[Metric]:
        """The engine thread's steps by kind (decode / prefill / mixed): mean decode step time and batch
        width are ``seconds / steps`` and ``sequences / steps`` of kind decode."""
        tallies = self.runtime.engine.stats.by_kind
        for field, name, help_text in (
            ("steps", "leyline_engine_steps", "Batched forward steps the engine ran, by kind"),
            ("seconds", "leyline_engine_step_seconds", "Engine thread time in steps (forward, sampling), by kind"),
            ("tokens", "leyline_engine_step_tokens", "Tokens computed in steps, by kind"),
            ("sequences", "leyline_engine_step_sequences", "Sequences in steps, summed over steps, by kind"),
        ):
            family = CounterMetricFamily(name, help_text, labels=["kind"])
            for kind, tally in tallies.items():
                family.add_metric([kind], getattr(tally, field))
            yield family

    def _per_tenant(self) -> Iterator[Metric]:
        tenancy = self.runtime.tenancy
        sessions = self.runtime.sessions_per_tenant()
        blocks = self.runtime.blocks_per_tenant()
        tenants = sorted(set(tenancy.stats) | set(sessions))
        for kind in ("prefilled", "reused", "rotated", "recomputed"):
            family = CounterMetricFamily(f"leyline_tenant_prompt_tokens_{kind}",
                                         f"leyline_prompt_tokens_{kind}, per tenant", labels=["tenant"])
            for t in tenants:
                family.add_metric([t], getattr(tenancy.stats_of(t), f"{kind}_tokens"))
            yield family
        families = (
            (CounterMetricFamily, "leyline_tenant_evictions", "Sessions of this tenant evicted",
             lambda t: tenancy.stats_of(t).evictions),
            (GaugeMetricFamily, "leyline_tenant_sessions_live", "Sessions of this tenant in the cache",
             lambda t: sessions.get(t, 0)),
            (GaugeMetricFamily, "leyline_tenant_cache_blocks_used", "KV cache blocks this tenant's sessions hold",
             lambda t: blocks.get(t, 0)),
            (GaugeMetricFamily, "leyline_tenant_cache_share_blocks",
             "Blocks within which other tenants cannot evict this tenant's sessions",
             lambda t: tenancy.share(blocks, t)),
        )
        for kind, name, help_text, value in families:
            family = kind(name, help_text, labels=["tenant"])
            for t in tenants:
                family.add_metric([t], value(t))
            yield family


class TenantView:
    """A registry's series labelled with one tenant (what that tenant's /metrics shows)."""

    def __init__(self, registry: CollectorRegistry, tenant: str):
        self.registry = registry
        self.tenant = tenant

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.labels.get("tenant") == self.tenant]
            if samples:
                mine = Metric(family.name, family.documentation, family.type, family.unit)
                mine.samples = samples
                yield mine


class ServiceMetrics:
    def __init__(self, runtime: Runtime):
        self.registry = CollectorRegistry()
        self.registry.register(RuntimeCollector(runtime))
        self.directives = Counter(
            "leyline_directives", "Directives applied, by requested mode, applied mode and fallback reason",
            ["requested_mode", "applied_mode", "fallback_reason", "tenant"], registry=self.registry)
        self.directive_latency = Histogram(
            "leyline_directive_batch_seconds", "Time to apply one directive batch (inside the runtime)",
            ["tenant"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.auto_choices = Counter(
            "leyline_auto_choices", "What mode \"auto\" chose per directive, and why",
            ["choice", "reason", "tenant"], registry=self.registry)
        self.completion_tokens = Counter(
            "leyline_completion_tokens", "Tokens generated", ["tenant"], registry=self.registry)
        self.requests = Counter(
            "leyline_generations", "Generations, by endpoint and finish reason",
            ["endpoint", "finish_reason", "tenant"], registry=self.registry)

    def observe_directives(self, result: DirectiveResult, tenant: str = DEFAULT_TENANT) -> None:
        self.directive_latency.labels(tenant).observe(result.elapsed_ms / 1000.0)
        for o in result.outcomes:
            self.directives.labels(o.requested_mode, o.applied_mode, o.fallback_reason or "none", tenant).inc()
            if o.auto is not None:
                self.auto_choices.labels(o.auto.choice, o.auto.reason, tenant).inc()

    def observe_generation(self, endpoint: str, finish_reason: str, completion_tokens: int,
                           tenant: str = DEFAULT_TENANT) -> None:
        self.completion_tokens.labels(tenant).inc(completion_tokens)
        self.requests.labels(endpoint, finish_reason, tenant).inc()

    def render(self, tenant: str | None = None) -> bytes:
        """Everything (``tenant`` None), or one tenant's series only."""
        return generate_latest(self.registry if tenant is None else TenantView(self.registry, tenant))
