"""compare.bench_served on the tiny model: offline and served get the same requests, and the
report carries both sides' throughput and step breakdown."""
from __future__ import annotations

import json
from pathlib import Path

from compare.bench_served import main
from compare.tiny_model import ensure_tiny_model


def test_served_and_offline_run_the_same_requests(tmp_path: Path, default_model_dir: str) -> None:
    tiny = ensure_tiny_model(Path(default_model_dir))
    assert main(["--out", str(tmp_path), "--model", str(tiny), "--num-prompts", "6",
                 "--output-len", "8", "--num-threads", "1"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    offline, served = res["offline"], res["served"]
    assert offline["total_output_tokens"] == served["total_output_tokens"] == 6 * 8
    assert offline["total_input_tokens"] == served["total_input_tokens"] > 6 * 128
    for side in (offline, served):
        assert side["output_throughput"] > 0 and side["step_forward_ms_per_step"] > 0
    assert "| output tok/s |" in (tmp_path / "report.md").read_text()
