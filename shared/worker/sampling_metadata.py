"""Per-step sampling parameters of a batch, gathered once into tensors for the Sampler.

Each optional field is ``None`` when no row in the batch needs it, so the sampler can
skip whole stages: an all-greedy batch without penalties is a bare argmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.core.request import Request
from shared.messages import SamplingParams

# Top-p without top-k first tries the best this-many tokens (a partial topk) instead of
# sorting the vocabulary; it falls back to the sort when the nucleus may reach further.
NUCLEUS_CANDIDATES = 1024


@dataclass
class PenaltyMetadata:
    """Penalty parameters plus the token history they apply to (one row per request)."""

    presence: torch.Tensor          # [B] float
    frequency: torch.Tensor         # [B] float
    repetition: torch.Tensor        # [B] float, 1.0 = off
    output_token_ids: list[list[int]]
    prompt_token_ids: list[list[int]]   # empty for rows without a repetition penalty


@dataclass
class FilterMetadata:
    """Temperature and truncation of the random rows; greedy rows hold neutral values."""

    temperature: torch.Tensor               # [B] float, 1.0 on greedy rows
    top_k: torch.Tensor | None = None       # [B] long, vocab size where disabled, 1 on greedy rows
    max_top_k: int | None = None            # largest k over random rows, with top_k
    top_p: torch.Tensor | None = None       # [B] float, 1.0 where disabled
    min_p: torch.Tensor | None = None       # [B] float, 0.0 where disabled
    # [B] float: probability mass the top NUCLEUS_CANDIDATES must hold for the row's kept
    # set to lie inside them; None when some random row can never be covered.
    nucleus_need: torch.Tensor | None = None


@dataclass
class SamplingMetadata:
    all_greedy: bool
    greedy_mask: torch.Tensor | None = None      # [B] bool; only for mixed batches
    filters: FilterMetadata | None = None        # None when all rows are greedy
    penalties: PenaltyMetadata | None = None
    seeded_rows: list[int] = field(default_factory=list)   # random rows with a seed
    num_logprobs: list[int | None] = field(default_factory=list)
    max_num_logprobs: int | None = None          # None: no row asked for logprobs

    @classmethod
    def from_requests(cls, requests: list[Request], vocab_size: int,
                      device: torch.device | str = "cpu") -> SamplingMetadata:
        params = [r.sampling_params for r in requests]
        greedy = [p.greedy for p in params]
        random_rows = [i for i, g in enumerate(greedy) if not g]
        asked = [p.logprobs for p in params if p.logprobs is not None]
        mixed = bool(random_rows) and len(random_rows) < len(params)
        return cls(
            all_greedy=not random_rows,
            greedy_mask=torch.tensor(greedy, dtype=torch.bool, device=device) if mixed else None,
            filters=_filters(params, greedy, vocab_size, device) if random_rows else None,
            penalties=_penalties(requests, device),
            seeded_rows=[i for i in random_rows if params[i].seed is not None],
            num_logprobs=[p.logprobs for p in params],
            max_num_logprobs=max(asked) if asked else None,
        )


def _filters(params: list[SamplingParams], greedy: list[bool], vocab_size: int,
             device: torch.device | str) -> FilterMetadata:
    def col(values: list[float] | list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    rand = [p for p, g in zip(params, greedy) if not g]
    meta = FilterMetadata(temperature=col([1.0 if g else p.temperature for p, g in zip(params, greedy)]))
    if any(0 < p.top_k < vocab_size for p in rand):
        # Greedy rows get k=1 so they never widen the candidate set.
        ks = [1 if g else min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size
              for p, g in zip(params, greedy)]
        meta.top_k = col(ks, torch.long)
        meta.max_top_k = max(k for k, g in zip(ks, greedy) if not g)
    if any(p.top_p < 1.0 for p in rand):
        meta.top_p = col([1.0 if g else p.top_p for p, g in zip(params, greedy)])
    if any(p.min_p > 0.0 for p in rand):
        meta.min_p = col([0.0 if g else p.min_p for p, g in zip(params, greedy)])
    if (meta.top_p is not None and vocab_size > NUCLEUS_CANDIDATES
            and (meta.max_top_k or vocab_size) > NUCLEUS_CANDIDATES):
        need = [_mass_needed(p, g) for p, g in zip(params, greedy)]
        if max(need) <= 1.0:
            meta.nucleus_need = col(need)
    return meta


def _mass_needed(p: SamplingParams, greedy: bool) -> float:
    if greedy or 0 < p.top_k <= NUCLEUS_CANDIDATES:
        return 0.0                  # already confined to the candidates
    if p.top_k <= 0 and p.top_p < 1.0:
        return p.top_p
    return 2.0                      # unfiltered or k > candidates: never covered


def _penalties(requests: list[Request], device: torch.device | str) -> PenaltyMetadata | None:
    params = [r.sampling_params for r in requests]
    if all(p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 and p.repetition_penalty == 1.0
           for p in params):
        return None

    def col(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    return PenaltyMetadata(
        presence=col([p.presence_penalty for p in params]),
        frequency=col([p.frequency_penalty for p in params]),
        repetition=col([p.repetition_penalty for p in params]),
        output_token_ids=[r.output_token_ids for r in requests],
        # The prompt is only read for the repetition penalty; skip it elsewhere.
        prompt_token_ids=[r.prompt_token_ids if p.repetition_penalty != 1.0 else []
                          for r, p in zip(requests, params)],
    )
