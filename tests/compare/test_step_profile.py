"""compare.step_profile: decode.c's stage timers exist only in the timed build, and a profile of
real decode steps (tiny random model, real tokenizer, int8 weights) accounts for the step."""
from __future__ import annotations

from pathlib import Path

import pytest

from compare.step_profile import profile, render, timed_kernels
from compare.tiny_model import ensure_tiny_model
from shared import LLM
from shared.worker.model_fetch import cache_dir
from shared.worker.native.abi import GEMM_STAGES, STAGES
from shared.worker.native.build import load_native


@pytest.fixture(scope="module")
def tiny_dir(default_model_dir: str) -> Path:
    return ensure_tiny_model(Path(default_model_dir))


def test_only_the_timed_build_keeps_stage_times() -> None:
    plain = load_native(cache_dir() / "native")
    assert plain is not None and plain.stage_times() is None
    timed = timed_kernels()
    assert timed.path != plain.path         # its own cache entry: the flag is in the build key
    assert timed.stage_times() == (dict.fromkeys(STAGES, 0.0), 0)


def test_profile_of_decode_steps_adds_up(tiny_dir: Path) -> None:
    llm = LLM(str(tiny_dir), dtype="float32", quantization="int8", max_num_seqs=2, num_threads=2)
    p = profile(llm, batch=2, prompt_len=12, max_tokens=7)
    # 7 tokens: the first comes from the prefill step (12 x 2 tokens, not counted), 6 decode steps.
    assert p.steps == 6 and p.batch == 2
    assert all(p.stages[s] > 0 for s in (*GEMM_STAGES, "attention", "rope_store", "silu"))
    assert p.lm_head > 0 and p.phases["forward"] > 0
    assert sum(p.stages.values()) + p.lm_head < p.phases["forward"] * 1.5   # per-step medians
    assert 0 < p.gemm < p.step and p.rest > 0
    assert "step / GEMM" in render(p)
