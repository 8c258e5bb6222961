"""scripts/gpu_check.py --cpu-dry-run end to end: a moved module or a renamed import breaks this
test here on CPU instead of on the lent GPU machine. Every stage runs on tiny shapes (about
half a minute on two cores)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGES = ["kernels", "models", "agreement", "offline", "serving"]


@pytest.mark.slow      # ~35 s; the real tokenizer comes from the default model
def test_cpu_dry_run_passes_every_stage(tmp_path: Path, default_model_dir: str) -> None:
    out = tmp_path / "dry.json"
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--cpu-dry-run", "--out", str(out),
         "--workdir", str(tmp_path / "work"), "--tokenizer", default_model_dir],
        cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    log = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    assert f"PASS: wrote {out}" in proc.stdout, log
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["cpu_dry_run"] is True and report["ok"] is True
    assert list(report["stages"]) == STAGES
    assert all(stage["ok"] for stage in report["stages"].values())
    counts = report["stages"]["kernels"]["counts"]
    assert counts.get("passed", 0) > 0 and "failed" not in counts and "error" not in counts
    assert report["stages"]["serving"]["engines"].keys() == {"v0", "v1"}
