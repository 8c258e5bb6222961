"""Workloads are reproducible from their seed, and open-loop arrivals have the asked rate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from compare.workload import Workload, arrival_times, ordinary_vocab, sample_requests

VOCAB = list(range(100, 5000))


def _w(seed: int = 0, **kw: object) -> Workload:
    args: dict[str, object] = dict(name="w", num_prompts=50, input_len=(8, 32), output_len=(4, 12),
                                   request_rate=10.0, burstiness=1.0, seed=seed)
    return Workload(**(args | kw))  # type: ignore[arg-type]


def test_same_seed_same_dataset_and_arrivals() -> None:
    assert sample_requests(_w(3), VOCAB) == sample_requests(_w(3), VOCAB)
    assert arrival_times(_w(3)) == arrival_times(_w(3))


def test_different_seed_differs() -> None:
    assert sample_requests(_w(3), VOCAB) != sample_requests(_w(4), VOCAB)
    assert arrival_times(_w(3)) != arrival_times(_w(4))


def test_lengths_in_range_and_ids_from_vocab() -> None:
    reqs = sample_requests(_w(), VOCAB)
    assert len(reqs) == 50
    assert all(8 <= len(r.prompt_token_ids) <= 32 and 4 <= r.output_len <= 12 for r in reqs)
    assert all(100 <= t < 5000 for r in reqs for t in r.prompt_token_ids)
    # The ranges are actually used, not collapsed to one value.
    assert len({len(r.prompt_token_ids) for r in reqs}) > 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_mean_rate_and_burstiness(burstiness: float) -> None:
    times = arrival_times(_w(num_prompts=20001, request_rate=5.0, burstiness=burstiness))
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    assert (len(times) - 1) / times[-1] == pytest.approx(5.0, rel=0.04)
    gaps = np.diff(times)
    # Gamma with shape k: coefficient of variation 1/sqrt(k); smaller k is burstier.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_infinite_rate_sends_all_at_once() -> None:
    assert arrival_times(_w(request_rate=math.inf)) == [0.0] * 50


def test_ordinary_vocab_leaves_out_special_tokens(default_tokenizer_json: str) -> None:
    from tokenizers import Tokenizer

    vocab = ordinary_vocab(default_tokenizer_json)
    special = set(Tokenizer.from_file(default_tokenizer_json).get_added_tokens_decoder())
    assert special and not special & set(vocab)
    assert len(vocab) > 40000
