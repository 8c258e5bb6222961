"""Medians over repeats, v1/v0 ratios, and how flags override the presets."""
from __future__ import annotations

from pathlib import Path

import pytest

from compare.aggregate import build_results, median_figures, ratio_figures
from compare.cli import build_parser, config_from_args
from compare.runner import RunRecord
from compare.server_proc import ServerSettings


def test_median_skips_missing_values() -> None:
    m = median_figures([{"a": 1.0, "b": None}, {"a": 5.0, "b": None}, {"a": 3.0, "b": 2.0}])
    assert m == {"a": 3.0, "b": 2.0}
    assert median_figures([{"a": None}]) == {"a": None}


def test_ratio_is_v1_over_v0_and_undefined_for_zero_base() -> None:
    r = ratio_figures({"x": 2.0, "y": 0.0, "z": None}, {"x": 5.0, "y": 1.0, "z": 1.0})
    assert r == {"x": 2.5, "y": None, "z": None}


def test_build_results_groups_and_ratios() -> None:
    recs = [RunRecord("tiny", "c4", "v0", i, {"output_throughput": t}, {"forward_busy": 0.5})
            for i, t in enumerate([100.0, 120.0, 110.0])]
    recs += [RunRecord("tiny", "c4", "v1", i, {"output_throughput": t}, {"forward_busy": 0.9})
             for i, t in enumerate([200.0, 260.0, 220.0])]
    res = build_results(recs, {"workloads": [{"name": "c4", "concurrency": 4}]}, {"cpu": "x"}, {"tiny": "/m"})
    entry = res["models"]["tiny"]["workloads"]["c4"]
    assert entry["workload"]["concurrency"] == 4 and entry["engines"]["v0"]["repeats"] == 3
    assert entry["engines"]["v0"]["client"]["output_throughput"] == 110.0
    assert entry["engines"]["v1"]["client"]["output_throughput"] == 220.0
    assert entry["ratio_v1_over_v0"]["client"]["output_throughput"] == pytest.approx(2.0)
    assert entry["ratio_v1_over_v0"]["server"]["forward_busy"] == pytest.approx(1.8)


def _cfg(*argv: str):
    return config_from_args(build_parser().parse_args(["--out", "/tmp/x", *argv]))


def test_quick_preset_and_overrides() -> None:
    q = _cfg("--quick")
    assert q.models == ["tiny"] and q.repeats == 1 and q.concurrencies == [4, 16]
    assert sum(w.num_prompts for w in q.workloads()) <= 40
    o = _cfg("--quick", "--concurrency", "2", "--models", "both", "--request-rate", "0",
             "--input-len", "5", "9", "--num-threads", "1")
    assert o.models == ["tiny", "default"] and [w.name for w in o.workloads()] == ["c2"]
    assert o.input_len == (5, 9) and o.num_threads == 1 and o.repeats == 1
    d = _cfg()
    assert d.repeats == 2 and d.models == ["tiny", "default"] and d.num_threads is None
    assert [w.name for w in d.workloads()] == ["c1", "c4", "c16", "c64", "rate4"]
    assert len({w.seed for w in d.workloads()}) == 5   # no prefix-cache hits across workloads
    u = _cfg("--url", "http://h:1")
    assert u.engines == ("url",) and u.models == ["url"] and u.out == Path("/tmp/x")


def test_bad_model_setting_rejected() -> None:
    with pytest.raises(SystemExit):
        _cfg("--models", "huge")


def test_named_workloads_and_the_servers_own_thread_count() -> None:
    w1 = _cfg("--workload", "W1")
    assert [(w.name, w.num_prompts) for w in w1.workloads()] == [("c16", 64)]
    assert w1.input_len == (128, 128) and w1.output_len == (128, 128) and w1.endpoint == "chat"
    assert w1.models == ["default"] and w1.num_threads is None
    w3 = _cfg("--workload", "W3", "--url", "http://127.0.0.1:9", "--repeats", "3")
    assert [(w.name, w.num_prompts) for w in w3.workloads()] == [("c64", 128)]
    assert w3.models == ["url"] and w3.repeats == 3 and w3.output_len == (64, 64)
    assert "--num-threads" not in ServerSettings(model="m").flags()
    assert ServerSettings(model="m", num_threads=3).flags()[:2] == ["--num-threads", "3"]
