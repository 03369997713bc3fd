"""Prometheus metrics of one server (its own registry, so several apps can live in one process).

HTTP requests are counted by endpoint and status and timed per endpoint here; the engine's own counters and
gauges (tokens computed vs requested, cache hits, queue depth, KV pages, forward steps and their time) are read
from `AsyncEngine.stats()` when /metrics is scraped."""

from __future__ import annotations

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# engine stats key -> (metric name, help); counters only grow, gauges are the state now
ENGINE_COUNTERS = {
    "requests": ("engine_requests", "engine requests (score and generate) admitted"),
    "tokens_requested": ("engine_tokens_requested", "tokens the requests needed (prompt and generated)"),
    "tokens_computed": ("engine_tokens_computed", "tokens run through the model"),
    "cache_hit_tokens": ("engine_cache_hit_tokens", "requested tokens served from the prefix cache"),
    "forward_steps": ("engine_forward_steps", "engine steps run"),
}
ENGINE_GAUGES = {
    "running": ("engine_running_requests", "requests being computed"),
    "kv_pages_used": ("engine_kv_pages_used", "KV cache pages in use"),
    "kv_pages_total": ("engine_kv_pages_total", "KV cache pages in all"),
}
LOOP_GAUGES = {  # the async engine's own (LoopStats)
    "queue_depth": ("engine_queue_depth", "requests waiting to be admitted"),
    "in_flight": ("engine_in_flight_requests", "requests submitted and not done"),
}


class EngineCollector:
    def __init__(self, stats):
        self.stats = stats  # a callable returning the async engine's LoopStats

    def collect(self):
        s = self.stats()
        for key, (name, text) in ENGINE_COUNTERS.items():
            yield CounterMetricFamily(name, text, value=getattr(s.engine, key))
        for key, (name, text) in ENGINE_GAUGES.items():
            yield GaugeMetricFamily(name, text, value=getattr(s.engine, key))
        for key, (name, text) in LOOP_GAUGES.items():
            yield GaugeMetricFamily(name, text, value=getattr(s, key))
        # every step's seconds, as the engine recorded them
        counts = np.histogram(s.step_seconds, bins=[0.0, *STEP_BUCKETS, np.inf])[0].cumsum().tolist()
        buckets = [(str(b), c) for b, c in zip([*STEP_BUCKETS, "+Inf"], counts)]
        yield HistogramMetricFamily(
            "engine_step_seconds",
            "time of one engine step (forward, log-probs, sampling)",
            buckets=buckets,
            sum_value=float(np.sum(s.step_seconds)),
        )


class Metrics:
    def __init__(self, engine_stats):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "http_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "http_request_seconds",
            "HTTP request latency by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineCollector(engine_stats))

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
