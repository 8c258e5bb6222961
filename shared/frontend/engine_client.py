"""The contract between the API layer and an engine; the API layer knows nothing else."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from shared.frontend.outputs import RequestOutput
from shared.frontend.tokenizer import Tokenizer
from shared.messages import ModelInfo, SamplingParams


class EngineClient(Protocol):
    """Implemented by ``engine_v0.AsyncEngine`` (in-process) and ``engine_v1.AsyncLLM`` (ZMQ)."""

    tokenizer: Tokenizer
    model_info: ModelInfo

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 trace: bool = False, priority: int = 0,
                 prefill_leader: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream delta outputs of one sequence (n == 1) until one has ``finished``.

        n > 1 is a parent request in the caller (``shared/api/fanout.py``) with one child
        sequence per choice: children after the first pass the first's id as
        ``prefill_leader``, and the core prefills the shared prompt once and forks its KV
        (``shared/core/prefill_fork.py``).

        ``priority``: lower runs first under ``--scheduling-policy priority``; under fcfs the
        core refuses anything but 0 (``ParamError``).

        Raises ``QueueFullError`` when too many requests wait, ``EngineDeadError`` when the
        engine cannot serve; closing the iterator early aborts the request.
        """
        ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` if the engine cannot serve."""
        ...

    def stalled_for(self) -> float | None:
        """Seconds since the engine last made progress while requests are in flight (None:
        nothing in flight); the watchdog declares it dead past ``--engine-step-timeout``."""
        ...

    def fail_all(self, error: BaseException) -> None:
        """The engine is dead: end every in-flight request with ``error``, refuse new ones."""
        ...

    @property
    def is_dead(self) -> bool: ...

    async def get_stats(self) -> dict:
        """Latest scheduler stats and step timings, for /metrics and the compare harness."""
        ...

    async def shutdown(self) -> None: ...
