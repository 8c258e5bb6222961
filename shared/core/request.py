"""A request's state inside the engine core (scheduler and model runner share it)."""
from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from shared.messages import EngineCoreRequest, RequestTimes, SamplingParams, TokenLogprobs

if TYPE_CHECKING:
    from shared.structured.compiler import GrammarState


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASON.get(self)


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """Prompt, generated tokens and progress of one sequence.

    ``num_computed_tokens`` counts tokens whose K/V sit in the cache; the scheduler moves it
    forward, resets it on preemption, and the prefix cache may start it above zero.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float = 0.0,
        trace: bool = False,
        trace_decode: bool = False,
        priority: int = 0,
        prefill_leader: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.trace = trace
        self.trace_decode = trace_decode    # keep every decode step's events (no summary)
        self.priority = priority            # lower runs first under the priority policy
        self.seq = 0                        # insertion order, set when queued: the last tie-break
        # Waits for this request's prompt KV and forks it (cleared once forked or moot).
        self.prefill_leader = prefill_leader
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[TokenLogprobs] = []
        self.prompt_logprobs: list[TokenLogprobs] = []    # scored so far (prompt_logprobs asked)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0      # prefix-cache hit on first scheduling
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        # Effective limit on output tokens, set by the scheduler from max_tokens and context.
        self.max_output_tokens: int = sampling_params.max_tokens or 0
        # Structured outputs: this sequence's matcher (set by the engine core before queueing).
        self.grammar: GrammarState | None = None
        # Core-clock timestamps for the queue and prefill metrics (see ``first_token_times``).
        self.queued_at = time.monotonic()
        self.scheduled_at: float | None = None     # first admission; a resume keeps it

    @classmethod
    def from_core_request(cls, req: EngineCoreRequest) -> Request:
        return cls(req.request_id, req.prompt_token_ids, req.sampling_params,
                   req.eos_token_id, req.arrival_time, req.trace, req.trace_decode, req.priority,
                   req.prefill_leader)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def first_token_times(self) -> RequestTimes:
        """Queue and prefill intervals, measured when the first token is sampled."""
        now = time.monotonic()
        scheduled = now if self.scheduled_at is None else self.scheduled_at
        return RequestTimes(queued=scheduled - self.queued_at, prefill=now - scheduled)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, {self.status.name})")
