"""Prometheus metrics of one app, named, typed and labelled as vLLM's v1 metrics.

A private registry, so two apps in one process never clash. Every series carries
``model_name`` (the served model name) and ``engine``, the labels vLLM's panels filter on;
``--metrics-prefix vllm`` publishes them as ``vllm:*`` so vLLM's Grafana dashboard reads
them unchanged. Gauges and the core's cumulative counters are read at scrape time, one series
per engine core (``engine="0"``, ``"1"``, ... under ``--data-parallel-size``; sum them for the
server); so is the per-step token histogram. The request series are fed from output streams
(``FanOut``) in the API process, each under the core that served the request.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shared.config import METRICS_PREFIXES
from shared.frontend.engine_client import EngineClient
from shared.messages import RequestTimes, StepTimes

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's
_FINISH_REASONS = ("stop", "length", "abort")   # pre-created, as vLLM does, so they read 0


@dataclass
class FinishedRequest:
    """One finished engine request (one choice), as the API layer saw it."""

    finish_reason: str | None
    e2e: float                      # HTTP arrival -> last output
    num_prompt_tokens: int
    num_generation_tokens: int
    decode: float | None            # first output -> last output; None if no token came
    times: RequestTimes | None      # the core's queue and prefill intervals
    engine: int = 0                 # the engine core that served it


def one_two_five_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class _Factory:
    """Makes prefixed metrics in one registry, already bound to the model_name/engine labels."""

    def __init__(self, prefix: str, model_name: str, registry: CollectorRegistry) -> None:
        self.prefix, self.registry = prefix, registry
        self.labels = {"model_name": model_name, "engine": "0"}

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(self._name(name), doc, list(self.labels), registry=self.registry).labels(**self.labels)

    def per_engine(self, kind: type[Gauge | Counter | Histogram], name: str, doc: str,
                   **kw: object) -> PerEngine:
        """A metric with one series per engine core, made on first use of each index."""
        metric = kind(self._name(name), doc, list(self.labels), registry=self.registry, **kw)
        return PerEngine(metric, self.labels["model_name"])

    def counter(self, name: str, doc: str) -> Counter:
        metric = Counter(self._name(name), doc, list(self.labels), registry=self.registry)
        return metric.labels(**self.labels)

    def histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(self._name(name), doc, list(self.labels), buckets=buckets, registry=self.registry)
        return metric.labels(**self.labels)

    def _name(self, name: str) -> str:
        return f"{self.prefix}:{name}"


class PerEngine:
    """One labelled metric; ``[i]`` is engine core i's series (created at 0 on first use)."""

    def __init__(self, metric: Gauge | Counter | Histogram, model_name: str) -> None:
        self.metric, self.model_name = metric, model_name
        self[0]     # engine 0 exists from the start, as with one core

    def __getitem__(self, engine: int) -> Gauge | Counter | Histogram:
        return self.metric.labels(model_name=self.model_name, engine=str(engine))


class ApiMetrics:
    def __init__(self, model_name: str, max_model_len: int, prefix: str = "twinserve") -> None:
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics prefix must be one of {', '.join(METRICS_PREFIXES)}, not {prefix!r}")
        self.registry = CollectorRegistry()
        f = _Factory(prefix, model_name, self.registry)
        self._define_scheduler_metrics(f)
        self._define_request_metrics(f, one_two_five_buckets(max_model_len))
        self._seen: dict[tuple[str, int], int] = {}   # (stats key, engine) -> total seen
        # Older vLLM dashboards (the example grafana.json among them) query vLLM's deprecated
        # names; under the vllm prefix the same values go out under those names too.
        legacy = prefix == "vllm"
        self.gpu_cache_usage = f.gauge("gpu_cache_usage_perc", "KV-cache usage (0-1); "
                                       "DEPRECATED alias of kv_cache_usage_perc") if legacy else None
        self.tpot = f.histogram("time_per_output_token_seconds", "DEPRECATED alias of "
                                "inter_token_latency_seconds", _ITL_BUCKETS) if legacy else None

    def _define_scheduler_metrics(self, f: _Factory) -> None:
        # Keyed by the scheduler's stats field each gauge shows.
        self.core_gauges = {
            "num_running": f.per_engine(Gauge, "num_requests_running", "Requests in the running batch"),
            "num_waiting": f.per_engine(Gauge, "num_requests_waiting", "Requests waiting to be scheduled"),
            "kv_cache_usage": f.per_engine(Gauge, "kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)"),
            "num_free_blocks": f.per_engine(Gauge, "num_free_blocks", "Free KV cache blocks"),
        }
        # Keyed by the scheduler's stats field whose running total each counter follows.
        self.core_totals = {
            "prefix_cache_queries": f.per_engine(Counter, "prefix_cache_queries",
                                                 "Prefix cache queries, in prompt tokens looked up"),
            "prefix_cache_hits": f.per_engine(Counter, "prefix_cache_hits",
                                              "Prefix cache hits, in tokens found cached"),
            "num_preemptions": f.per_engine(Counter, "num_preemptions",
                                            "Requests preempted by the scheduler"),
        }
        self.iteration_tokens = f.per_engine(Histogram, "iteration_tokens_total",
                                             "Tokens computed per engine step", buckets=_ITERATION_BUCKETS)

    def _define_request_metrics(self, f: _Factory, token_buckets: list[int]) -> None:
        def hist(name: str, doc: str, buckets: Sequence[float]) -> PerEngine:
            return f.per_engine(Histogram, name, doc, buckets=buckets)

        self.prompt_tokens = f.per_engine(Counter, "prompt_tokens", "Prompt tokens of scheduled requests")
        self.generation_tokens = f.per_engine(Counter, "generation_tokens", "Tokens generated")
        self._success = Counter(f._name("request_success"), "Engine requests finished",
                                [*f.labels, "finished_reason"], registry=self.registry)
        for reason in _FINISH_REASONS:
            self._success.labels(**f.labels, finished_reason=reason)
        self._model_name = f.labels["model_name"]
        self.ttft = hist("time_to_first_token_seconds", "Arrival to first generated token", _LATENCY_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Time between generated tokens", _ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to last token", _LATENCY_BUCKETS)
        self.queue_time = hist("request_queue_time_seconds", "Queued in the core until first scheduled",
                               _LATENCY_BUCKETS)
        self.prefill_time = hist("request_prefill_time_seconds", "First scheduled until the first token",
                                 _LATENCY_BUCKETS)
        self.decode_time = hist("request_decode_time_seconds", "First token until the last token",
                                _LATENCY_BUCKETS)
        self.request_prompt_tokens = hist("request_prompt_tokens", "Prompt tokens per finished request",
                                          token_buckets)
        self.request_generation_tokens = hist("request_generation_tokens",
                                              "Generated tokens per finished request", token_buckets)
        self.max_generation_tokens = hist(
            "request_max_num_generation_tokens",
            "Most tokens generated by one choice of a prompt (its n samples)", token_buckets)

    async def render(self, engine: EngineClient) -> bytes:
        stats = await engine.get_stats()
        # Per core when the engine lists its cores; a client without the list is one core.
        for i, core in enumerate(stats.get("engines") or [stats]):
            for key, gauge in self.core_gauges.items():
                gauge[i].set(core.get(key, 0))
            self._follow_core_totals(core, i)
        if self.gpu_cache_usage is not None:
            self.gpu_cache_usage.set(stats.get("kv_cache_usage", 0.0))
        return generate_latest(self.registry)

    def _follow_core_totals(self, stats: dict, engine: int) -> None:
        """The scheduler reports running totals; a counter can only add the growth since."""
        for key, counter in self.core_totals.items():
            value, seen = stats.get(key, 0), self._seen.get((key, engine), 0)
            if value > seen:
                counter[engine].inc(value - seen)
                self._seen[key, engine] = value

    def on_step(self, step: StepTimes, engine: int = 0) -> None:
        """One engine step of core ``engine`` (called by the engine's output handler)."""
        if step.num_tokens:
            self.iteration_tokens[engine].observe(step.num_tokens)

    def on_tokens(self, n_new: int, since_last: float | None, since_arrival: float,
                  engine: int = 0) -> None:
        """One delta of ``n_new`` tokens; ``since_last`` is None for a request's first delta."""
        self.generation_tokens[engine].inc(n_new)
        if since_last is None:
            self.ttft[engine].observe(since_arrival)
            return
        itl = self.itl[engine]
        for _ in range(n_new):  # a delta may carry several tokens; spread the gap over them
            itl.observe(since_last / n_new)
            if self.tpot is not None:
                self.tpot.observe(since_last / n_new)

    def on_finished(self, done: FinishedRequest) -> None:
        i = done.engine
        self.e2e[i].observe(done.e2e)
        self._success.labels(model_name=self._model_name, engine=str(i),
                             finished_reason=done.finish_reason or "unknown").inc()
        self.request_prompt_tokens[i].observe(done.num_prompt_tokens)
        self.request_generation_tokens[i].observe(done.num_generation_tokens)
        if done.times is not None:
            self.queue_time[i].observe(done.times.queued)
            self.prefill_time[i].observe(done.times.prefill)
        if done.decode is not None:
            self.decode_time[i].observe(done.decode)

    def on_prompt_finished(self, max_generation_tokens: int, engine: int = 0) -> None:
        """All n choices of one prompt finished: the longest of them (vLLM's sequence group)."""
        self.max_generation_tokens[engine].observe(max_generation_tokens)
