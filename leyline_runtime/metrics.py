"""Prometheus metrics of one service instance.

Each app gets its own :class:`CollectorRegistry`, so several apps (tests,
benchmarks) can live in one process. Token and cache figures are read from
the runtime at scrape time; directive and completion figures are counted by
the HTTP layer as requests finish.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from leyline_sdk.protocol import DirectiveResult

from .runtime import Runtime

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


class ServiceMetrics:
    def __init__(self, runtime: Runtime):
        self.registry = CollectorRegistry()
        self.registry.register(RuntimeCollector(runtime))
        self.directives = Counter(
            "leyline_directives", "Directives applied, by requested mode, applied mode and fallback reason",
            ["requested_mode", "applied_mode", "fallback_reason"], registry=self.registry)
        self.directive_latency = Histogram(
            "leyline_directive_batch_seconds", "Time to apply one directive batch (inside the runtime)",
            buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.auto_choices = Counter(
            "leyline_auto_choices", "What mode \"auto\" chose per directive, and why",
            ["choice", "reason"], registry=self.registry)
        self.completion_tokens = Counter(
            "leyline_completion_tokens", "Tokens generated", registry=self.registry)
        self.requests = Counter(
            "leyline_generations", "Generations, by endpoint and finish reason",
            ["endpoint", "finish_reason"], registry=self.registry)

    def observe_directives(self, result: DirectiveResult) -> None:
        self.directive_latency.observe(result.elapsed_ms / 1000.0)
        for o in result.outcomes:
            self.directives.labels(o.requested_mode, o.applied_mode, o.fallback_reason or "none").inc()
            if o.auto is not None:
                self.auto_choices.labels(o.auto.choice, o.auto.reason).inc()

    def observe_generation(self, endpoint: str, finish_reason: str, completion_tokens: int) -> None:
        self.completion_tokens.inc(completion_tokens)
        self.requests.labels(endpoint, finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
