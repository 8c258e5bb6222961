"""/metrics as vLLM's dashboards read it: names, labels and values that add up."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.api.metrics import ApiMetrics, one_two_five_buckets
from shared.config import ServerConfig
from tests.server_util import start_server, stop_server
from tests.shared.api.api_helpers import COMPLETIONS, wait_engine_idle

Samples = dict[str, list[tuple[dict[str, str], float]]]   # sample name -> (labels, value)

# What vLLM's examples/online_serving/prometheus_grafana/grafana.json queries (read at commit
# e88892c9), plus the newer names vLLM's docs/design/metrics.md lists for that dashboard.
# Not served: vllm:num_requests_swapped and vllm:cpu_cache_usage_perc, which only vLLM's V0
# engine had (no swapping here either).
GRAFANA_NAMES = (
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
    # newer dashboards: the renamed series
    "vllm:inter_token_latency_seconds_bucket", "vllm:kv_cache_usage_perc",
)


def scrape(client: httpx.Client) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(v for lab, v in samples.get(name, []) if labels.items() <= lab.items())


def model_name(client: httpx.Client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def random_prompt(n: int) -> list[int]:
    """Token ids no other test sends, so the prefix cache cannot have seen them."""
    return [random.randrange(200, 20000) for _ in range(n)]


def complete(client: httpx.Client, prompt: list[int], max_tokens: int) -> dict:
    r = client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


# -- against the shared server, both engines ------------------------------------------------
def test_request_series_add_up(client: httpx.Client) -> None:
    wait_engine_idle(client)
    before = scrape(client)
    usage = complete(client, random_prompt(20), max_tokens=5)
    after = scrape(client)
    label = {"model_name": model_name(client), "engine": "0"}

    def delta(name: str, **extra: str) -> float:
        return value(after, name, **label, **extra) - value(before, name, **label, **extra)

    assert delta("twinserve:request_prompt_tokens_sum") == usage["prompt_tokens"] == 20
    assert delta("twinserve:request_generation_tokens_sum") == usage["completion_tokens"] == 5
    assert delta("twinserve:request_max_num_generation_tokens_sum") == 5
    assert delta("twinserve:request_success_total", finished_reason="length") == 1
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "e2e_request_latency_seconds"):
        assert delta(f"twinserve:{name}_count") == 1, name
        assert delta(f"twinserve:{name}_sum") >= 0, name
    e2e = delta("twinserve:e2e_request_latency_seconds_sum")
    parts = sum(delta(f"twinserve:request_{p}_time_seconds_sum") for p in ("queue", "prefill", "decode"))
    assert 0 < parts <= e2e    # the core's intervals fit inside the HTTP request's lifetime
    # A lone request: one prefill step of its uncached prompt, then one step per later token.
    hits = delta("twinserve:prefix_cache_hits_total")
    assert delta("twinserve:iteration_tokens_total_sum") == 20 - hits + 5 - 1
    assert delta("twinserve:iteration_tokens_total_count") == 5
    assert delta("twinserve:prefix_cache_queries_total") == 20
    assert "twinserve:num_preemptions_total" in after


def test_every_series_carries_model_name_and_engine(client: httpx.Client) -> None:
    complete(client, random_prompt(4), max_tokens=2)
    samples = scrape(client)
    name = model_name(client)
    for sample_name, rows in samples.items():
        for labels, _ in rows:
            assert labels.get("model_name") == name and labels.get("engine") == "0", sample_name


def test_shared_prefix_raises_prefix_cache_hits(client: httpx.Client) -> None:
    prefix = random_prompt(48)     # three full blocks of 16
    complete(client, prefix + [201], max_tokens=1)
    before = scrape(client)
    complete(client, prefix + [202], max_tokens=1)
    after = scrape(client)
    hits = (value(after, "twinserve:prefix_cache_hits_total")
            - value(before, "twinserve:prefix_cache_hits_total"))
    queries = (value(after, "twinserve:prefix_cache_queries_total")
               - value(before, "twinserve:prefix_cache_queries_total"))
    assert (hits, queries) == (48, 49)


# -- a server of its own: the vllm prefix -----------------------------------------------------
def test_vllm_prefix_serves_what_vllms_grafana_dashboard_queries(tmp_path: Path,
                                                                  default_model_dir: str) -> None:
    # Float weights: quantizing them at start-up would take most of this test's time.
    srv = start_server("v0", tmp_path / "server.log", "--metrics-prefix", "vllm", "--quantization", "none")
    try:
        with srv.client() as c:
            complete(c, random_prompt(8), max_tokens=3)
            samples = scrape(c)
            name = model_name(c)
    finally:
        assert stop_server(srv) == 0
    missing = [n for n in GRAFANA_NAMES
               if not any(lab.get("model_name") == name for lab, _ in samples.get(n, []))]
    assert missing == []
    assert not [n for n in samples if n.startswith("twinserve:")]
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 1
    assert value(samples, "vllm:time_per_output_token_seconds_count") == 2   # tokens 2 and 3


# -- no server ----------------------------------------------------------------------------------
class _StatsEngine:
    """Just enough of an EngineClient for ``render``: scheduler stats that the test sets."""

    def __init__(self) -> None:
        self.stats: dict = {}

    async def get_stats(self) -> dict:
        return self.stats


def test_core_totals_become_counters_that_only_add_growth() -> None:
    metrics, engine = ApiMetrics("m", 100), _StatsEngine()
    seen = []
    for queries, hits, preemptions in ((10, 0, 0), (25, 16, 1), (25, 16, 1)):
        engine.stats = {"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                        "num_preemptions": preemptions}
        text = asyncio.run(metrics.render(engine)).decode()
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        seen.append(tuple(samples[f"twinserve:{n}_total"]
                          for n in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions")))
    assert seen == [(10, 0, 0), (25, 16, 1), (25, 16, 1)]


def test_one_two_five_buckets_and_prefix_check() -> None:
    assert one_two_five_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert one_two_five_buckets(2048)[-3:] == [500, 1000, 2000]
    with pytest.raises(ValueError, match="metrics_prefix"):
        ServerConfig(metrics_prefix="sglang")
