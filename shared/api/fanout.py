"""Run one HTTP request as several engine requests and merge their delta streams.

A request with n samples and p prompts becomes n * p engine requests with ids
``{id}-{index}``, where index is the choice index. The FanOut is the parent request: the
first choice of each prompt leads, the others name it as their ``prefill_leader`` so the
core prefills the prompt once (not when prompt logprobs are asked: each child scores them). Each runs in its own task that
pushes outputs into one queue; closing the FanOut cancels the tasks, and each task
aborts its engine request if it did not finish, so the engine frees its blocks.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from shared.api.metrics import ApiMetrics, FinishedRequest
from shared.api.requests import Job
from shared.api.tracing import HttpTrace
from shared.errors import EngineDeadError
from shared.frontend.engine_client import EngineClient
from shared.frontend.outputs import RequestOutput
from shared.messages import RequestTimes, SamplingParams


@dataclass
class _Child:
    index: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0
    prefill_leader: str | None = None
    finished: bool = False
    first_at: float | None = None
    last_at: float | None = None
    num_generated: int = 0
    times: RequestTimes | None = None      # the core's queue/prefill intervals
    engine: int | None = None              # the core serving it, from its first output


class FanOut:
    def __init__(self, engine: EngineClient, base_id: str, jobs: list[Job], n: int,
                 metrics: ApiMetrics, registry: set[FanOut], trace: HttpTrace | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.trace = trace              # set only when this request's lifecycle is traced
        self.arrival = time.perf_counter()
        self.children = [
            _Child(j * n + i, f"{base_id}-{j * n + i}", job.prompt_ids, job.params.for_child(i),
                   job.priority, _leader(base_id, job, j * n, i))
            for j, job in enumerate(jobs) for i in range(n)
        ]
        self.n = n
        self._queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()
        self._remaining = len(self.children)
        self._tasks: list[asyncio.Task] = []
        self._registry = registry

    def start(self) -> FanOut:
        self._registry.add(self)
        if self.trace is not None:      # children's core events group under the response id
            for child in self.children:
                self.trace.link(child.request_id)
        self._tasks = [asyncio.create_task(self._pump(c)) for c in self.children]
        return self

    async def next(self) -> tuple[int, RequestOutput] | None:
        """The next (choice index, delta output) of any child; None once all finished."""
        if self._remaining == 0:
            return None
        index, out, exc = await self._queue.get()
        if exc is not None:
            raise exc
        assert out is not None
        if out.finished:
            self._remaining -= 1
        return index, out

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while (item := await self.next()) is not None:
            yield item

    def close(self) -> None:
        """Synchronous on purpose: it runs in finally blocks of cancelled handlers."""
        self._registry.discard(self)
        if self.trace is not None:
            self.trace.close()
        for task in self._tasks:
            task.cancel()

    def fail(self, exc: BaseException) -> None:
        """Wake the consumer with ``exc`` (server shutdown) and stop all children."""
        self._queue.put_nowait((-1, None, exc))
        self.close()

    async def _pump(self, child: _Child) -> None:
        gen: object = None
        try:
            gen = self.engine.generate(child.request_id, child.prompt_ids, child.params,
                                       trace=self.trace is not None, priority=child.priority,
                                       prefill_leader=child.prefill_leader)
            if inspect.isawaitable(gen):  # tolerate an engine whose generate is a coroutine
                gen = await gen
            async for out in gen:
                self._observe(child, out)
                self._queue.put_nowait((child.index, out, None))
                if child.finished:
                    return
            raise EngineDeadError("the engine ended a request without finishing it")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._queue.put_nowait((child.index, None, exc))
        finally:
            await _close_quietly(gen)
            if not child.finished:
                await _abort_quietly(self.engine, child.request_id)

    def _observe(self, child: _Child, out: RequestOutput) -> None:
        now = time.perf_counter()
        n_new = sum(len(c.token_ids) for c in out.outputs)
        if child.engine is None:    # counted once scheduled, as vLLM does, under its core
            child.engine = out.engine_index
            self.metrics.prompt_tokens[child.engine].inc(len(child.prompt_ids))
        if out.times is not None:
            child.times = out.times
        if n_new:
            since_last = None if child.last_at is None else now - child.last_at
            self.metrics.on_tokens(n_new, since_last, now - self.arrival, child.engine)
            child.first_at = now if child.first_at is None else child.first_at
            child.last_at = now
            child.num_generated += n_new
        if out.finished:
            child.finished = True
            self._observe_finished(child, out, now)

    def _observe_finished(self, child: _Child, out: RequestOutput, now: float) -> None:
        reason = out.outputs[0].finish_reason if out.outputs else None
        decode = None if child.first_at is None or child.last_at is None else child.last_at - child.first_at
        self.metrics.on_finished(FinishedRequest(reason, now - self.arrival, len(child.prompt_ids),
                                                 child.num_generated, decode, child.times,
                                                 child.engine or 0))
        start = child.index - child.index % self.n      # the n choices of this child's prompt
        group = self.children[start:start + self.n]
        if all(c.finished for c in group):
            self.metrics.on_prompt_finished(max(c.num_generated for c in group), child.engine or 0)


def _leader(base_id: str, job: Job, first: int, i: int) -> str | None:
    if i == 0 or job.params.prompt_logprobs is not None:
        return None
    return f"{base_id}-{first}"


async def _close_quietly(gen: object) -> None:
    aclose = getattr(gen, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        pass  # the iterator is gone either way; abort below frees the request


async def _abort_quietly(engine: EngineClient, request_id: str) -> None:
    try:
        await engine.abort(request_id)
    except Exception:
        pass  # a dead engine holds no blocks worth freeing
