"""Prometheus metrics of one app: a private registry, so two apps in one process never clash."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shared.frontend.engine_client import EngineClient

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ApiMetrics:
    """Gauges come from ``engine.get_stats()`` at scrape time; the rest from output streams."""

    def __init__(self, engine_name: str) -> None:
        r = self.registry = CollectorRegistry()
        self.engine_name = engine_name
        self.running = Gauge("twinserve:num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge("twinserve:num_requests_waiting", "Requests waiting to be scheduled", registry=r)
        self.kv_usage = Gauge("twinserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)", registry=r)
        self.free_blocks = Gauge("twinserve:num_free_blocks", "Free KV cache blocks", registry=r)
        self.prompt_tokens = Counter("twinserve:prompt_tokens", "Prompt tokens submitted", registry=r)
        self.generation_tokens = Counter("twinserve:generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("twinserve:request_success", "Engine requests finished",
                                ["finished_reason"], registry=r)
        self.ttft = Histogram("twinserve:time_to_first_token_seconds",
                              "Arrival to first generated token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("twinserve:inter_token_latency_seconds",
                             "Time between generated tokens", buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("twinserve:e2e_request_latency_seconds",
                             "Arrival to last token", buckets=_LATENCY_BUCKETS, registry=r)

    async def render(self, engine: EngineClient) -> bytes:
        stats = await engine.get_stats()
        self.running.set(stats.get("num_running", 0))
        self.waiting.set(stats.get("num_waiting", 0))
        self.kv_usage.set(stats.get("kv_cache_usage", 0.0))
        self.free_blocks.set(stats.get("num_free_blocks", 0))
        return generate_latest(self.registry)

    def on_tokens(self, n_new: int, since_last: float | None, since_arrival: float) -> None:
        """One delta of ``n_new`` tokens; ``since_last`` is None for a request's first delta."""
        self.generation_tokens.inc(n_new)
        if since_last is None:
            self.ttft.observe(since_arrival)
            return
        for _ in range(n_new):  # a delta may carry several tokens; spread the gap over them
            self.itl.observe(since_last / n_new)

    def on_finished(self, reason: str | None, since_arrival: float) -> None:
        self.e2e.observe(since_arrival)
        self.finished.labels(finished_reason=reason or "unknown").inc()
