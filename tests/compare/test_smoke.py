"""Smoke run of the whole harness: real v0 and v1 servers, the tiny model, a few requests.

Find it with ``pytest tests/compare -k smoke``. It starts two servers, so it takes tens of
seconds; every request must complete with exactly the asked number of tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import psutil

from compare.cli import main

OUT_LEN = 6


def test_smoke_compare_tiny_model_both_engines(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    # Other tests' session-scoped servers may be running: only new children count.
    already = {p.pid for p in psutil.Process().children(recursive=True)}
    rc = main(["--quick", "--out", str(out), "--concurrency", "2", "--num-prompts", "4",
               "--request-rate", "20", "--rate-num-prompts", "3", "--warmup-requests", "1",
               "--input-len", "8", "16", "--output-len", str(OUT_LEN), str(OUT_LEN),
               "--num-threads", "1", "--no-progress", "--health-timeout", "60"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == "twinserve-compare/1" and res["machine"]["cpu_model"]
    wls = res["models"]["tiny"]["workloads"]
    assert set(wls) == {"c2", "rate20"}
    for name, n in (("c2", 4), ("rate20", 3)):
        entry = wls[name]
        for engine in ("v0", "v1"):
            client, server = entry["engines"][engine]["client"], entry["engines"][engine]["server"]
            assert (client["completed"], client["failed"]) == (n, 0)
            assert client["total_output_tokens"] == n * OUT_LEN     # ignore_eos: exact lengths
            assert client["output_throughput"] > 0 and client["median_ttft_ms"] > 0
            assert client["median_tpot_ms"] > 0 and client["p99_itl_ms"] > 0
            assert server["steps"] >= OUT_LEN and server["step_forward_s"] > 0
            assert 0 < server["forward_busy"] <= 1.0
            assert server["cpu_api_s"] is not None
        assert entry["engines"]["v1"]["server"]["cpu_core_s"] is not None   # separate core process
        assert entry["engines"]["v0"]["server"]["cpu_core_s"] is None
        assert entry["ratio_v1_over_v0"]["client"]["output_throughput"] > 0
    raw = sorted(p.relative_to(out / "raw").as_posix() for p in (out / "raw").rglob("*.json"))
    assert raw == [f"tiny/{w}/{e}-r0.json" for w in ("c2", "rate20") for e in ("v0", "v1")]
    report = (out / "report.md").read_text()
    assert "v1/v0" in report and "output throughput" in report and "Machine" in report
    for png in ("throughput_vs_concurrency", "latency_distributions", "step_breakdown", "busy_and_loop_lag"):
        assert (out / f"{png}.png").stat().st_size > 5000
        assert f"({png}.png)" in report
    _assert_no_server_left(already)


def _assert_no_server_left(already: set[int]) -> None:
    """Both servers (and v1's engine core) are gone after the run."""
    alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in already
             and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline() for p in alive]
