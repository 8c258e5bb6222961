"""Server-side figures are the differences of two /debug/stats snapshots."""
from __future__ import annotations

import pytest

from compare.server_stats import Snapshot, server_figures


def _stats(forward: float, steps: int, lag_samples: int, lag_sum: float, lag_max: float) -> dict[str, object]:
    totals = {"schedule": 0.1, "prepare": 0.2, "forward": forward, "sample": 0.3, "update": 0.0,
              "output": 0.05, "steps": steps, "tokens": steps * 4}
    return {"step_totals": totals, "pids": {"api": 1, "core": None},
            "loop_lag": {"samples": lag_samples, "sum_s": lag_sum, "max_s": lag_max}}


def test_window_differences() -> None:
    before = Snapshot(10.0, _stats(1.0, 100, 50, 0.5, 0.2), {"api": 3.0})
    after = Snapshot(14.0, _stats(3.0, 300, 130, 0.9, 0.2), {"api": 5.0})
    f = server_figures(before, after)
    assert f["window_s"] == pytest.approx(4.0)
    assert f["steps"] == 200 and f["step_tokens"] == 800 and f["tokens_per_step"] == pytest.approx(4.0)
    assert f["step_forward_s"] == pytest.approx(2.0)
    assert f["step_forward_ms_per_step"] == pytest.approx(10.0)
    assert f["step_sample_s"] == pytest.approx(0.0)
    assert f["forward_busy"] == pytest.approx(0.5)         # 2 s of forward in 4 s
    assert f["cpu_api_s"] == pytest.approx(2.0) and f["cpu_core_s"] is None
    assert f["cpu_cores_used"] == pytest.approx(0.5)
    assert f["loop_lag_mean_ms"] == pytest.approx(5.0)     # 0.4 s over 80 samples
    assert f["loop_lag_max_ms"] is None                    # max did not rise inside the window
    assert f["loop_lag_max_since_start_ms"] == pytest.approx(200.0)


def test_max_lag_known_when_it_rose() -> None:
    f = server_figures(Snapshot(0.0, _stats(0, 0, 0, 0.0, 0.01)), Snapshot(1.0, _stats(0, 1, 10, 0.1, 0.03)))
    assert f["loop_lag_max_ms"] == pytest.approx(30.0)


def test_server_without_stats_gives_only_the_window() -> None:
    f = server_figures(Snapshot(0.0, None), Snapshot(2.0, None))
    assert f["window_s"] == 2.0 and f.get("forward_busy") is None and f["cpu_total_s"] is None


def test_data_parallel_cores_cpu_adds_up() -> None:
    before = Snapshot(0.0, _stats(1.0, 10, 0, 0.0, 0.0), {"api": 1.0, "core": 2.0, "core1": 4.0})
    after = Snapshot(2.0, _stats(1.0, 10, 0, 0.0, 0.0), {"api": 1.5, "core": 3.0, "core1": 5.5})
    f = server_figures(before, after)
    assert f["cpu_core_s"] == pytest.approx(2.5) and f["cpu_total_s"] == pytest.approx(3.0)


def test_data_parallel_setting_adds_a_v1_dp_server() -> None:
    from compare.config import CompareConfig
    from compare.server_proc import engine_flags

    cfg = CompareConfig(out="x", engines=("v1",), data_parallel_size=2)
    assert cfg.engines == ("v1", "v1-dp2")
    assert engine_flags("v1-dp2") == ("v1", ["--data-parallel-size", "2"])
    assert engine_flags("v0") == ("v0", [])
    assert CompareConfig(out="x", engines=("v1",), tensor_parallel_size=3).engines == ("v1", "v1-tp3")
    assert engine_flags("v1-tp3") == ("v1", ["--tensor-parallel-size", "3"])
    with pytest.raises(ValueError, match="v1-dpN"):
        CompareConfig(out="x", engines=("v2",))
