"""The long-prompt workload end to end on fresh v1 servers (the real model, a scaled-down load):
long prompts arrive while the streams decode, and the report holds both phases."""
from __future__ import annotations

import json
from pathlib import Path

from compare.bench_long import main


def test_long_workload_runs_both_phases(tmp_path: Path, default_model_dir: str) -> None:
    out = tmp_path / "long"
    rc = main(["--out", str(out), "--engines", "v1", "--long-prefill-token-threshold", "32",
               "--streams", "2", "--stream-prompt", "16", "--stream-output", "40",
               "--long-prompt", "200", "--long-output", "4", "--long-every-s", "0.3",
               "--first-long-s", "0.2"])
    assert rc == 0
    result = json.loads((out / "long.json").read_text())
    assert result["server_flags"][-2:] == ["--long-prefill-token-threshold", "32"]
    v1 = result["results"]["v1"]
    alone, mixed = v1["alone"], v1["with_long"]
    assert alone["num_long"] == 0 and "long_ttft_mean_ms" not in alone
    assert mixed["num_long"] >= 1 and mixed["long_ttft_max_ms"] >= mixed["long_ttft_mean_ms"] > 0
    for phase in (alone, mixed):
        assert 0 < phase["stream_itl_p50_ms"] <= phase["stream_itl_p99_ms"] <= phase["stream_itl_max_ms"]
    assert v1["itl_p99_ratio"] == mixed["stream_itl_p99_ms"] / alone["stream_itl_p99_ms"]
    table = (out / "long.md").read_text()
    assert table.count("\n| v1 |") == 1 and "p99 ratio" in table
    assert {p.name for p in out.glob("*.log")} == {"v1-alone.log", "v1-with_long.log"}


def test_compare_workload_long_passes_the_server_flags(tmp_path: Path, monkeypatch, default_model_dir: str) -> None:
    """``twinserve compare --workload long`` runs this benchmark with the harness's server flags."""
    from compare import bench_long, cli

    seen = {}

    def fake_run(out, engines, url, api_key, settings):
        seen.update(out=out, engines=engines, url=url, flags=settings.flags())
        out.mkdir(parents=True)
        (out / "long.md").write_text("table")
    monkeypatch.setattr(bench_long, "run", fake_run)
    assert cli.main(["--workload", "long", "--out", str(tmp_path / "o"), "--engines", "v1",
                     "--num-threads", "1", "--quantization", "int8"]) == 0
    assert seen["engines"] == ["v1"] and seen["url"] is None
    flags = seen["flags"]
    assert flags[flags.index("--num-threads") + 1] == "1"
    assert flags[flags.index("--quantization") + 1] == "int8"
