"""Prometheus metrics of one server (its own registry, so several apps can live in one process).

HTTP requests are counted by endpoint and status and timed per endpoint here; the engine's own counters and
gauges (every EngineStats field: tokens computed vs requested, cache hits, KV pages, forward steps, ...; the queue,
the requests in flight and the steps' times) are read from `AsyncEngine.stats()` when /metrics is scraped."""

from __future__ import annotations

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.stats import COUNTER, JOB, NAMES, describe, kind

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# The engine's fields (engine/stats.py) as metrics: every one but a closed job's own figures (a server's engine runs no
# closed job), named engine_<field> unless renamed here; its counters are Prometheus counters, the rest gauges.
RENAMED = {"running": "engine_running_requests", "waiting": "engine_waiting_requests"}
LOOP_GAUGES = {  # the async engine's own (LoopStats)
    "queue_depth": ("engine_queue_depth", "requests waiting to be admitted"),
    "in_flight": ("engine_in_flight_requests", "engine requests admitted and not done"),
}


def engine_metrics() -> list[tuple[str, str, str]]:
    """(EngineStats field, metric name, kind) of every engine metric."""
    return [(n, RENAMED.get(n, f"engine_{n}"), kind(n)) for n in NAMES if kind(n) != JOB]


class EngineCollector:
    def __init__(self, stats):
        self.stats = stats  # a callable returning the async engine's LoopStats

    def collect(self):
        s = self.stats()
        for key, name, what in engine_metrics():
            family = CounterMetricFamily if what == COUNTER else GaugeMetricFamily
            yield family(name, describe(key), value=getattr(s.engine_stats, key))
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
