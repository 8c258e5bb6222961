"""compare.quality on the tiny random model: both scoring paths run and agree, every mode is
reported (a bf16 KV cache too), and the greedy match is measured against the first (reference)
mode."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compare import quality
from compare.tiny_model import ensure_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(default_model_dir: str) -> Path:
    return ensure_tiny_model(Path(default_model_dir))


def test_quality_reports_each_mode(tiny_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "quality.json"
    results = quality.main(["--model", str(tiny_dir), "--modes", "none", "int8", "int4", "none@bfloat16",
                            "--dtype", "float32", "--num-threads", "1", "--max-text-tokens", "48",
                            "--num-prompts", "2", "--gen-tokens", "4", "--json", str(out)])
    assert [r.mode for r in results] == ["none", "int8", "int4", "none@bfloat16"]
    ref = results[0]
    assert ref.scored_prefill == ref.scored_decode == 47 and ref.greedy_match == 1.0
    # One long prefill and token-by-token decode steps compute the same float32 numbers.
    assert math.isclose(ref.ppl_prefill, ref.ppl_decode, rel_tol=1e-3)
    for r in results:
        assert math.isfinite(r.ppl_prefill) and r.ppl_prefill > 1 and 0 <= r.greedy_match <= 1
    assert results[1].ppl_prefill != ref.ppl_prefill          # int8 really ran another kernel
    # A bf16 KV cache rounds what decode steps read back: close to the float32 cache, not equal.
    bf16_kv = results[3]
    assert bf16_kv.ppl_decode != ref.ppl_decode
    assert math.isclose(bf16_kv.ppl_decode, ref.ppl_decode, rel_tol=0.05)
    assert json.loads(out.read_text())[2]["mode"] == "int4"
    table = capsys.readouterr().out
    assert "| int4 |" in table and "within 2%" in table


def test_the_shipped_text_is_long_enough(default_model_dir: str) -> None:
    from shared.frontend.tokenizer import Tokenizer

    assert len(Tokenizer(Path(default_model_dir)).encode(quality.TEXT.read_text())) >= 2000
