"""What the front end hands to callers: per-request outputs (never crosses processes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages import RequestTimes, TokenLogprobs


@dataclass
class CompletionOutput:
    """One choice. From the OutputProcessor ``text``/``token_ids``/``logprobs`` are this
    step's delta; ``LLM`` and non-streaming responses accumulate them."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt: str | None = None
    # SamplingParams.prompt_logprobs: one entry per prompt token (None for the first), on the
    # first output of the request.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    times: RequestTimes | None = None   # the core's queue/prefill intervals, on the first output
    engine_index: int = 0               # the engine core that produced it (data parallel)
