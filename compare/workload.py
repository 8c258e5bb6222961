"""Seeded synthetic workloads: random-token prompts, exact output lengths, arrival times.

A prompt is a list of random token ids drawn from the real tokenizer's ordinary vocabulary
(special tokens left out), sent as a token-id prompt, or decoded to text when the endpoint
takes text. Output lengths are exact because every request sets ``ignore_eos``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    """One measured load: closed-loop (``concurrency``) and/or open-loop (``request_rate``)."""
    name: str
    num_prompts: int
    input_len: tuple[int, int]        # inclusive range of prompt lengths (tokens)
    output_len: tuple[int, int]       # inclusive range of output lengths (tokens)
    concurrency: int | None = None    # most requests in flight; None: unbounded
    request_rate: float = math.inf    # requests/s of Poisson-like arrivals; inf: all at once
    burstiness: float = 1.0           # gamma shape; 1.0 is Poisson, < 1 burstier
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError("num_prompts must be >= 1")
        for lo, hi in (self.input_len, self.output_len):
            if not 1 <= lo <= hi:
                raise ValueError(f"bad length range ({lo}, {hi})")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.request_rate <= 0 or self.burstiness <= 0:
            raise ValueError("request_rate and burstiness must be > 0")

    def describe(self) -> dict[str, object]:
        d = asdict(self)
        d["request_rate"] = None if math.isinf(self.request_rate) else self.request_rate
        return d


@dataclass(frozen=True)
class SampleRequest:
    prompt_token_ids: list[int]
    output_len: int


def sample_requests(w: Workload, vocab: list[int]) -> list[SampleRequest]:
    """The workload's prompts: same seed, same prompts; ``vocab`` is the ids to draw from."""
    rng = np.random.default_rng([w.seed, 1])
    pool = np.asarray(vocab, dtype=np.int64)
    in_lens = rng.integers(w.input_len[0], w.input_len[1] + 1, size=w.num_prompts)
    out_lens = rng.integers(w.output_len[0], w.output_len[1] + 1, size=w.num_prompts)
    return [SampleRequest(rng.choice(pool, size=int(n)).tolist(), int(m))
            for n, m in zip(in_lens, out_lens)]


def arrival_times(w: Workload) -> list[float]:
    """Send offsets (s) from the run's start; all zero for an infinite rate.

    Gaps are gamma-distributed with shape = burstiness and mean 1/rate (scale =
    1 / (rate * burstiness)), as ``vllm bench serve`` does; the first request goes at 0.
    """
    if math.isinf(w.request_rate):
        return [0.0] * w.num_prompts
    rng = np.random.default_rng([w.seed, 2])
    gaps = rng.gamma(w.burstiness, 1.0 / (w.request_rate * w.burstiness), size=w.num_prompts - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def ordinary_vocab(tokenizer_json: str) -> list[int]:
    """Token ids of the tokenizer's ordinary vocabulary (no added/special tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    special = set(tok.get_added_tokens_decoder())
    return [i for i in range(tok.get_vocab_size(with_added_tokens=False)) if i not in special]


def decode_prompts(tokenizer_json: str, requests: list[SampleRequest]) -> list[str]:
    """Text versions of the prompts, for endpoints that take text (chat)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    return tok.decode_batch([r.prompt_token_ids for r in requests], skip_special_tokens=True)
