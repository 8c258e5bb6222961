"""logit_bias in the sampler: batched, per row, before greedy and random picks; logprobs raw."""
from __future__ import annotations

import pytest
import torch

from shared.errors import ParamError
from shared.messages import SamplingParams
from shared.worker.sampler import Sampler, apply_logit_bias
from tests.shared.worker.test_sampler import make_req, rand_logits


def test_bias_moves_only_its_rows_and_tokens() -> None:
    logits = rand_logits(3, seed=4)
    reqs = [make_req("a", logit_bias={5: 2.5, 7: -1.0}), make_req("b"),
            make_req("c", logit_bias={5: -3.0})]
    out = apply_logit_bias(logits, reqs)
    want = logits.clone()
    want[0, 5] += 2.5
    want[0, 7] -= 1.0
    want[2, 5] -= 3.0
    assert torch.equal(out, want)
    assert not torch.equal(out, logits)     # the caller's logits are left alone


def test_greedy_follows_a_large_bias_and_logprobs_stay_raw() -> None:
    logits = rand_logits(2, seed=5)
    target = int(logits[0].argmin())
    reqs = [make_req("a", temperature=0.0, logit_bias={target: 100.0}, logprobs=0),
            make_req("b", temperature=0.0, logprobs=0)]
    out = Sampler().sample(logits, reqs)
    assert out.token_ids == [target, int(logits[1].argmax())]
    raw = torch.log_softmax(logits[0], dim=-1)[target].item()
    assert out.logprobs[0] is not None and out.logprobs[0].logprob == pytest.approx(raw, abs=1e-5)


def test_random_rows_never_pick_a_banned_token() -> None:
    logits = torch.zeros(4, 8)           # uniform: every token equally likely without the bias
    banned = {t: -100.0 for t in range(7)}
    reqs = [make_req(str(i), temperature=1.0, seed=i, logit_bias=banned) for i in range(4)]
    assert Sampler().sample(logits, reqs).token_ids == [7, 7, 7, 7]


@pytest.mark.parametrize("bias", [{1: 100.5}, {-1: 1.0}, {i: 1.0 for i in range(301)},
                                  {1: float("nan")}])
def test_sampling_params_reject_bad_bias(bias: dict[int, float]) -> None:
    with pytest.raises(ParamError) as err:
        SamplingParams(logit_bias=bias)
    assert err.value.param == "logit_bias"
