from __future__ import annotations

import math

import pytest
import torch

from shared.core.request import Request
from shared.messages import SamplingParams
from shared.worker.sampler import Sampler, apply_penalties, apply_top_k_top_p, nucleus_from_candidates
from shared.worker.sampling_metadata import SamplingMetadata

V = 50


def make_req(rid: str = "r", prompt: list[int] | None = None, output: list[int] | None = None,
             **params: object) -> Request:
    req = Request(rid, prompt or [1, 2, 3], SamplingParams(**params))
    for t in output or []:
        req.append_output_token(t)
    return req


def rand_logits(batch: int, seed: int = 0, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * 3


def test_greedy_equals_argmax_and_skips_logprobs() -> None:
    logits = rand_logits(4)
    out = Sampler().sample(logits, [make_req(str(i), temperature=0.0) for i in range(4)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 4


def test_greedy_rows_stay_exact_in_a_mixed_batch() -> None:
    logits = rand_logits(6, seed=1)
    reqs = [make_req(str(i), temperature=0.0 if i % 2 == 0 else 1.5) for i in range(6)]
    out = Sampler().sample(logits, reqs)
    argmax = logits.argmax(-1).tolist()
    assert [out.token_ids[i] for i in (0, 2, 4)] == [argmax[i] for i in (0, 2, 4)]


def test_seeded_row_same_alone_and_in_batch() -> None:
    logits = rand_logits(5, seed=2) / 3           # flat enough that draws really vary

    def run(batch_rows: list[int], steps: int = 8) -> list[int]:
        sampler, tokens = Sampler(), []
        for step in range(steps):
            reqs = [make_req("seeded", temperature=1.0, seed=7) if r == 0
                    else make_req(f"o{r}-{step}", temperature=1.0) for r in batch_rows]
            out = sampler.sample(logits[batch_rows], reqs)
            tokens.append(out.token_ids[batch_rows.index(0)])
        return tokens

    alone = run([0])
    assert run([3, 0, 1, 4]) == alone
    assert run([0, 2]) == alone
    assert len(set(alone)) > 1                    # generator advances: not one repeated draw


def test_forget_resets_seeded_generator() -> None:
    logits = rand_logits(1, seed=3) / 3
    sampler = Sampler()
    req = make_req("a", temperature=1.0, seed=11)
    first = [sampler.sample(logits, [req]).token_ids[0] for _ in range(6)]
    sampler.forget(["a"])
    again = [sampler.sample(logits, [req]).token_ids[0] for _ in range(6)]
    assert first == again


def test_different_seeds_differ() -> None:
    logits = rand_logits(1, seed=4) / 3
    seqs = []
    for seed in (1, 2):
        sampler = Sampler()
        req = make_req("a", temperature=1.0, seed=seed)
        seqs.append([sampler.sample(logits, [req]).token_ids[0] for _ in range(10)])
    assert seqs[0] != seqs[1]


def test_top_k_1_and_tiny_top_p_equal_greedy() -> None:
    logits = rand_logits(8, seed=5)
    argmax = logits.argmax(-1).tolist()
    sampler = Sampler()
    for _ in range(5):
        top_k = [make_req(str(i), temperature=2.0, top_k=1) for i in range(8)]
        top_p = [make_req(str(i), temperature=2.0, top_p=1e-6) for i in range(8)]
        assert sampler.sample(logits, top_k).token_ids == argmax
        assert sampler.sample(logits, top_p).token_ids == argmax


def test_top_k_and_top_p_keep_only_allowed_tokens() -> None:
    # probs ~ [0.5, 0.3, 0.15, 0.05]
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(400, 1)
    sampler = Sampler()
    reqs = [make_req(str(i), temperature=1.0, top_k=2) for i in range(400)]
    assert set(sampler.sample(logits, reqs).token_ids) == {0, 1}
    # top_p 0.7: smallest prefix reaching 0.7 is {0, 1}; 0.85 needs {0, 1, 2}
    reqs = [make_req(str(i), temperature=1.0, top_p=0.7) for i in range(400)]
    assert set(sampler.sample(logits, reqs).token_ids) == {0, 1}
    reqs = [make_req(str(i), temperature=1.0, top_p=0.85) for i in range(400)]
    assert set(sampler.sample(logits, reqs).token_ids) == {0, 1, 2}


def test_min_p_filters_relative_to_top_prob() -> None:
    # min_p 0.45 of top prob 0.4 -> threshold 0.18: keeps 0 (0.4), 1 (0.3), 2 (0.2); drops 3.
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    logits = probs.log().repeat(500, 1)
    reqs = [make_req(str(i), temperature=1.0, min_p=0.45) for i in range(500)]
    assert set(Sampler().sample(logits, reqs).token_ids) == {0, 1, 2}
    reqs = [make_req(str(i), temperature=1.0, min_p=0.9) for i in range(50)]
    assert set(Sampler().sample(logits[:50], reqs).token_ids) == {0}


def test_temperature_sampling_follows_softmax() -> None:
    n = 6000
    base = torch.tensor([[2.0, 1.0, 0.0]])
    for temp in (1.0, 0.5):
        reqs = [make_req(str(i), temperature=temp) for i in range(n)]
        drawn = Sampler().sample(base.repeat(n, 1), reqs).token_ids
        counts = torch.bincount(torch.tensor(drawn), minlength=3)
        expected = torch.softmax(base[0] / temp, -1)
        freq = counts.float() / n
        # 4 standard deviations of a binomial share
        tol = 4 * (expected * (1 - expected) / n).sqrt()
        assert ((freq - expected).abs() <= tol).all(), (temp, freq, expected)


def test_penalties_match_hand_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    req = make_req("a", prompt=[4], output=[0, 0, 1], presence_penalty=0.5,
                   frequency_penalty=0.25, repetition_penalty=2.0)
    meta = SamplingMetadata.from_requests([req], vocab_size=5)
    got = apply_penalties(logits, meta.penalties)
    # repetition over prompt+output {0, 1, 4}: positive / 2, negative * 2
    # then output counts {0: 2, 1: 1}: - 0.25*count - 0.5*present
    expected = torch.tensor([[2.0 / 2 - 0.5 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 3.0, -2.0 * 2]])
    torch.testing.assert_close(got, expected)
    assert logits[0, 0] == 2.0                     # caller's tensor untouched


def test_penalties_are_per_row_and_steer_greedy() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    reqs = [make_req("a", output=[0], temperature=0.0, frequency_penalty=1.0),
            make_req("b", output=[0], temperature=0.0)]
    assert Sampler().sample(logits, reqs).token_ids == [1, 0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_from_raw_logits(temperature: float) -> None:
    logits = rand_logits(3, seed=6)
    reqs = [make_req("a", temperature=temperature, logprobs=3, repetition_penalty=3.0, output=[5]),
            make_req("b", temperature=temperature, logprobs=0),
            make_req("c", temperature=temperature)]
    out = Sampler().sample(logits, reqs)
    ref = torch.log_softmax(logits, -1)
    for row in (0, 1):
        lp = out.logprobs[row]
        tok = out.token_ids[row]
        assert lp.token_id == tok
        assert math.isclose(lp.logprob, ref[row, tok].item(), rel_tol=1e-5, abs_tol=1e-6)
        order = ref[row].argsort(descending=True).tolist()
        assert lp.rank == order.index(tok) + 1
    top = ref[0].topk(3)
    assert out.logprobs[0].top_ids == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(out.logprobs[0].top_logprobs), top.values)
    assert out.logprobs[1].top_ids == [] and out.logprobs[1].top_logprobs == []
    assert out.logprobs[2] is None


def test_logprob_rank_of_non_top_token() -> None:
    # min_p/top_k can't force it, so use a penalty to make greedy pick raw rank 3.
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])
    req = make_req("a", temperature=0.0, logprobs=1, output=[0, 1], presence_penalty=2.0,
                   frequency_penalty=2.0)
    out = Sampler().sample(logits, [req])
    assert out.token_ids == [2]
    assert out.logprobs[0].rank == 3
    assert out.logprobs[0].top_ids == [0]


def test_partial_topk_path_equals_full_sort_path() -> None:
    logits = rand_logits(4, seed=8)
    top_k = torch.tensor([3, 10, 1, 7])
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.3])
    fast = apply_top_k_top_p(logits, top_k, top_p, max_top_k=10)
    slow = apply_top_k_top_p(logits, top_k, top_p, max_top_k=None)
    torch.testing.assert_close(fast, slow)
    kept = (fast > float("-inf")).sum(-1)
    assert kept[0] == 3 and kept[2] == 1 and (kept <= top_k).all()


def test_mixed_batch_respects_each_rows_filters() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(4, 1)
    reqs = [make_req("k", temperature=1.0, top_k=1), make_req("g", temperature=0.0),
            make_req("p", temperature=1.0, top_p=0.6), make_req("free", temperature=1.0)]
    sampler, seen = Sampler(), [set() for _ in reqs]
    for _ in range(200):
        for row, tok in enumerate(sampler.sample(logits, reqs).token_ids):
            seen[row].add(tok)
    assert seen[:3] == [{0}, {0}, {0, 1}]
    assert seen[3] == {0, 1, 2, 3}


def test_top_p_candidate_path_equals_full_sort() -> None:
    vocab = 5000
    g = torch.Generator().manual_seed(9)
    peaked = torch.randn(3, vocab, generator=g)
    peaked[:, :300] += 5.0                          # nucleus well inside the best 1024 tokens
    reqs = [make_req("a", temperature=1.0, top_p=0.9), make_req("b", temperature=0.7, top_p=0.5),
            make_req("c", temperature=0.0)]
    meta = SamplingMetadata.from_requests(reqs, vocab).filters
    assert meta.nucleus_need is not None
    scaled = peaked / meta.temperature.unsqueeze(1)
    fast = nucleus_from_candidates(scaled, meta.top_k, meta.top_p, meta.nucleus_need)
    slow = apply_top_k_top_p(scaled, None, meta.top_p)
    assert fast is not None
    assert torch.equal(fast[:2].isinf(), slow[:2].isinf())
    assert 1 < (~fast[0].isinf()).sum() < 1024
    # a flat row's nucleus reaches past the candidates: the fast path must decline
    p = torch.tensor([0.9])
    assert nucleus_from_candidates(torch.zeros(1, vocab), None, p, need=p) is None


def test_top_p_free_row_in_batch_keeps_full_vocabulary() -> None:
    reqs = [make_req("p", temperature=1.0, top_p=0.5), make_req("free", temperature=1.0)]
    assert SamplingMetadata.from_requests(reqs, 5000).filters.nucleus_need is None


def test_min_tokens_blocks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(2, 8)
    logits[:, 3] = 10.0   # EOS is by far the most likely token
    logits[:, 5] = 9.0    # then a stop token id
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    young = Request("a", [1, 2], params, eos_token_id=3)
    grown = Request("b", [1, 2], params, eos_token_id=3)
    grown.append_output_token(7)
    grown.append_output_token(7)
    out = Sampler().sample(logits, [young, grown])
    assert out.token_ids[0] not in (3, 5)     # below min_tokens: EOS and stop id are masked
    assert out.token_ids[1] == 3              # min_tokens reached: EOS allowed again


@pytest.mark.parametrize("top_p", [5e-324, 1e-30])
def test_top_p_underflowing_float32_keeps_the_best_token(top_p: float) -> None:
    logits = torch.randn(3, 2000)
    params = SamplingParams(temperature=1.0, top_p=top_p, logprobs=0)
    reqs = [Request(str(i), [1], params) for i in range(3)]
    out = Sampler().sample(logits, reqs)
    assert out.token_ids == logits.argmax(dim=-1).tolist()


def test_a_row_that_breaks_sampling_fails_alone() -> None:
    """A request whose own state makes the batched sampler raise is reported; the other rows
    still get their tokens."""
    good = Request("good", [1, 2], SamplingParams(temperature=0.0))
    bad = Request("bad", [1, 2], SamplingParams(temperature=0.0, logit_bias={5: 1.0}))
    bad.sampling_params.logit_bias[10**9] = 1.0       # past the vocabulary: index_put raises
    logits = torch.randn(2, 50)
    out = Sampler().sample_safely(logits, [good, bad])
    assert list(out.failed) == [1] and "sampling failed" in out.failed[1]
    assert out.token_ids[0] == int(logits[0].argmax())
