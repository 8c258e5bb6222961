"""What the scheduler hands the model runner each step, and what comes back."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.core.request import Request
from shared.messages import TokenLogprobs


@dataclass
class ScheduledRequest:
    """Compute ``num_new_tokens`` tokens of ``request`` starting at ``start``.

    ``start`` is ``request.num_computed_tokens`` at scheduling time; the tokens are
    ``request.all_token_ids[start:start + num_new_tokens]``. ``block_ids`` is the request's
    whole block table (it covers at least ``start + num_new_tokens`` slots).
    """

    request: Request
    start: int
    num_new_tokens: int
    block_ids: list[int]

    @property
    def samples(self) -> bool:
        """True when this step reaches the request's last known token, so it emits one."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)
    # Requests that finished or were aborted since the last step: the runner drops their state.
    finished_ids: list[str] = field(default_factory=list)
    # KV blocks to copy (source, destination) before this step's forward: the block holding
    # a forked request's last prompt token, copied from its prefill leader.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # The traced subset of ``scheduled``; None (not allocated) when no request is traced.
    traced: list[ScheduledRequest] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """One sampled token (and its logprobs when asked) per request that samples."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # Logprobs of prompt tokens this step's chunks scored (requests with prompt_logprobs).
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # Requests whose own sampling work failed (e.g. their grammar's mask): they end with
    # this error, the rest of the batch goes on.
    failed: dict[str, str] = field(default_factory=dict)
