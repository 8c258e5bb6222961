"""Client-side metric math on hand-made timestamps, against values computed by hand."""
from __future__ import annotations

import math

import pytest

from compare.metrics import RequestResult, compute_metrics, tpot


def _results() -> list[RequestResult]:
    return [
        RequestResult(True, prompt_tokens=10, output_tokens=4, ttft=0.2, latency=0.5, itl=[0.1, 0.1, 0.1]),
        RequestResult(True, prompt_tokens=20, output_tokens=1, ttft=0.3, latency=0.3, itl=[]),
        RequestResult(True, prompt_tokens=30, output_tokens=3, ttft=0.1, latency=0.5, itl=[0.3, 0.1]),
        RequestResult(False, prompt_tokens=99, output_tokens=99, ttft=9.0, latency=9.0, error="HTTP 500"),
    ]


def test_counts_and_throughputs() -> None:
    m = compute_metrics(_results(), duration_s=2.0)
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 8)  # failed one not counted
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(4.0)
    assert m["total_token_throughput"] == pytest.approx(34.0)


def test_ttft_distribution() -> None:
    m = compute_metrics(_results(), 2.0)   # TTFTs 200, 300, 100 ms
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(20000 / 3))
    assert m["p90_ttft_ms"] == pytest.approx(280.0)   # linear: 200 + 0.8 * 100
    assert m["p99_ttft_ms"] == pytest.approx(298.0)


def test_tpot_excludes_one_token_answers() -> None:
    r = _results()
    assert tpot(r[0]) == pytest.approx(0.1)   # (0.5 - 0.2) / (4 - 1)
    assert tpot(r[1]) is None
    assert tpot(r[2]) == pytest.approx(0.2)   # (0.5 - 0.1) / (3 - 1)
    m = compute_metrics(r, 2.0)
    assert m["mean_tpot_ms"] == pytest.approx(150.0)
    assert m["median_tpot_ms"] == pytest.approx(150.0)
    assert m["p90_tpot_ms"] == pytest.approx(190.0)


def test_itl_pools_every_gap() -> None:
    m = compute_metrics(_results(), 2.0)   # gaps 100, 100, 100, 300, 100 ms
    assert m["mean_itl_ms"] == pytest.approx(140.0)
    assert m["median_itl_ms"] == pytest.approx(100.0)
    assert m["p99_itl_ms"] == pytest.approx(292.0)   # 100 + 0.96 * 200


def test_e2el() -> None:
    m = compute_metrics(_results(), 2.0)
    assert m["mean_e2el_ms"] == pytest.approx(1300 / 3)
    assert m["median_e2el_ms"] == pytest.approx(500.0)
    assert m["p90_e2el_ms"] == pytest.approx(500.0)


def test_all_failed_gives_none_not_nan() -> None:
    m = compute_metrics([RequestResult(False, error="x")], 1.0)
    assert m["completed"] == 0 and m["output_throughput"] == 0.0
    assert m["median_ttft_ms"] is None and m["p99_itl_ms"] is None
