"""Log-probabilities of a request's own prompt tokens (vLLM's ``prompt_logprobs``).

The logits at prompt position p score the prompt token at p + 1, so a prefill chunk covering
positions [start, end) scores tokens start + 1 .. min(end, num_prompt - 1). The runner takes
those rows of the step's hidden states, turns them into logits a slice at a time (a chunk of
1,024 rows would otherwise need 200 MB of float32 logits for a 49k vocabulary) and keeps each
token's logprob, rank and top-N. The first prompt token has no logprob (None), as in vLLM.

Prompt logprobs are only computed before a request's first output token: a preempted request
that recomputes its prompt later must not report them twice (the scheduler resets what a
preemption threw away), and prefix-cache hits are skipped for such requests so every position
is actually computed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shared.core.scheduler_output import ScheduledRequest
from shared.messages import TokenLogprobs
from shared.worker.sampler import token_logprobs

_LOGITS_SLICE = 256     # rows turned into logits at a time


@dataclass
class PromptRows:
    """The rows of one step's flat batch that score prompt tokens of one request."""

    request_id: str
    first_row: int          # the chunk's first row in the flat batch
    targets: list[int]      # the prompt tokens they score, in order
    num_top: int            # top-N alternatives asked for


def prompt_rows(s: ScheduledRequest, first_row: int) -> PromptRows | None:
    """What this chunk of ``s`` scores; None when it asked for nothing or scores nothing."""
    req = s.request
    num_top = req.sampling_params.prompt_logprobs
    if num_top is None or req.num_output_tokens > 0:
        return None
    prompt = req.prompt_token_ids
    last = min(s.start + s.num_new_tokens, len(prompt) - 1)     # last position with a next token
    if last <= s.start:
        return None
    return PromptRows(req.request_id, first_row, prompt[s.start + 1:last + 1], num_top)


def score_prompts(hidden: torch.Tensor, rows: list[PromptRows],
                  compute_logits: Callable[[torch.Tensor], torch.Tensor],
                  ) -> dict[str, list[TokenLogprobs]]:
    """Each request's prompt-token logprobs for this step's chunk, in position order."""
    out: dict[str, list[TokenLogprobs]] = {}
    for pr in rows:
        scored: list[TokenLogprobs] = []
        for lo in range(0, len(pr.targets), _LOGITS_SLICE):
            targets = pr.targets[lo:lo + _LOGITS_SLICE]
            start = pr.first_row + lo
            logits = compute_logits(hidden[start:start + len(targets)])
            ids = torch.tensor(targets, device=logits.device)
            lps = token_logprobs(torch.log_softmax(logits, dim=-1), ids, [pr.num_top] * len(targets))
            scored.extend(lp for lp in lps if lp is not None)
        out[pr.request_id] = scored
    return out
