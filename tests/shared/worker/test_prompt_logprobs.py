"""prompt_logprobs from the model runner: each prompt token scored by the logits before it,
however the prompt is chunked, cached or recomputed (tiny random model, real tokenizer, fp32)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compare.tiny_model import ensure_tiny_model
from shared import LLM, SamplingParams
from shared.worker.model_loader import load_model
from tests.shared.worker.test_model import BlockPool, new_caches, run_step

PROMPT = list(range(100, 160))      # 60 tokens: several 16-token blocks


@pytest.fixture(scope="module")
def tiny_dir(default_model_dir: str) -> Path:
    return ensure_tiny_model(Path(default_model_dir))


def _reference(folder: Path, ids: list[int]) -> torch.Tensor:
    """log p(token i | tokens < i) for i >= 1, from one plain forward pass."""
    model = load_model(folder, dtype=torch.float32)
    seq = BlockPool(16).seq(ids)
    run_step(model, new_caches(model), [(seq, len(ids))])
    lp = torch.log_softmax(seq.logits[0].float(), dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def _llm(folder: Path, **kw: object) -> LLM:
    return LLM(str(folder), dtype="float32", quantization="none", num_threads=1, **kw)


def _scored(llm: LLM, top: int = 0) -> list:
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=top))[0]
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(PROMPT)
    assert out.prompt_logprobs[0] is None
    return out.prompt_logprobs[1:]


def test_prompt_logprobs_match_a_plain_forward(tiny_dir: Path) -> None:
    ref = _reference(tiny_dir, PROMPT)
    got = _scored(_llm(tiny_dir), top=3)
    assert [lp.token_id for lp in got] == PROMPT[1:]
    torch.testing.assert_close(torch.tensor([lp.logprob for lp in got]), ref, atol=1e-4, rtol=0)
    for lp in got:      # top-3 sorted, and the token's rank agrees with them
        assert len(lp.top_ids) == 3 and lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)
        assert (lp.rank == 1) == (lp.top_ids[0] == lp.token_id)


def test_chunked_and_token_by_token_prefill_score_the_same(tiny_dir: Path) -> None:
    whole = [lp.logprob for lp in _scored(_llm(tiny_dir))]
    for budget in (7, 1):           # 1: every prompt token is its own (decode-shaped) step
        chunked = [lp.logprob for lp in _scored(_llm(tiny_dir, max_num_batched_tokens=budget))]
        torch.testing.assert_close(torch.tensor(chunked), torch.tensor(whole), atol=1e-4, rtol=0)


def test_a_prefix_cache_hit_does_not_drop_them(tiny_dir: Path) -> None:
    llm = _llm(tiny_dir)
    plain = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.prompt_logprobs is None
    again = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))[0]
    assert again.num_cached_tokens > 0           # the cache is warm for this prompt
    scored = _scored(llm)
    assert len(scored) == len(PROMPT) - 1 and all(lp is not None for lp in scored)
