"""What both engine clients share: per-request streams, output processing and aborts.

``engine_v0.AsyncEngine`` and ``engine_v1.AsyncLLM`` subclass ``EngineFrontend`` and supply
how a request reaches the core and how an abort does (same process, or over ZMQ).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from shared.errors import EngineDeadError, QueueFullError, RequestFailedError
from shared.frontend.output_processor import OutputProcessor
from shared.frontend.outputs import RequestOutput
from shared.frontend.tokenizer import Tokenizer
from shared.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    ModelInfo,
    SamplingParams,
    SchedulerStats,
    StepTimes,
)
from shared.trace.steps import Step
from shared.trace.store import TraceStore
from shared.trace.tracer import Tracer

_STEP_PHASES = ("schedule", "prepare", "forward", "sample", "update")
_FRONTEND_PHASES = ("output",)  # detokenization and stream feeding, in the API process
_SUMMED_STATS = ("num_running", "num_waiting", "num_free_blocks", "num_total_blocks",
                 "num_preemptions", "prefix_cache_queries", "prefix_cache_hits", "core_requests",
                 "num_forked_tokens")


class EngineFrontend:
    tokenizer: Tokenizer
    model_info: ModelInfo
    process_name = "api-server"   # how this process appears in lifecycle traces

    def __init__(self, tokenizer: Tokenizer, model_info: ModelInfo, max_waiting_requests: int,
                 num_engines: int = 1) -> None:
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.max_waiting_requests = max_waiting_requests
        self.output_processor = OutputProcessor(tokenizer)
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._dead: BaseException | None = None
        # One entry per engine core (data parallel); _stats is their sum, what one core shows.
        self._engine_stats: list[dict[str, Any]] = [
            {"engine": i, **dict.fromkeys(_SUMMED_STATS, 0), "kv_cache_usage": 0.0,
             "num_free_blocks": model_info.num_kv_blocks,
             "num_total_blocks": model_info.num_kv_blocks} for i in range(num_engines)]
        self._stats: dict[str, Any] = {}
        self._sum_engine_stats()
        self._step_totals = {p: 0.0 for p in _STEP_PHASES + _FRONTEND_PHASES} | {"steps": 0, "tokens": 0}
        self.core_pid: int | None = None
        # Lifecycle traces: the API layer records steps 1-3 and 13, this class 4 and 12; the
        # core's events arrive with its outputs. Only traced requests enter _traced.
        self.traces = TraceStore()
        self.tracer = Tracer(self.process_name, sink=self.traces.add)
        self._traced: dict[str, int] = {}     # request id -> outputs seen so far
        self._last_progress = time.monotonic()  # an output from the engine (see stalled_for)
        self._step_listeners: list[Callable[[StepTimes, int], None]] = []   # e.g. /metrics

    # -- hooks for the engines ---------------------------------------------------------------
    def _submit(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    def _abort_in_core(self, request_ids: list[str]) -> None:
        raise NotImplementedError

    # -- EngineClient ------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       trace: bool = False, priority: int = 0,
                       prefill_leader: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream delta outputs of one sequence; leaving early aborts it in the core."""
        self._check_alive()
        if len(self._queues) - self._stats["num_running"] >= self.max_waiting_requests:
            raise QueueFullError(f"more than {self.max_waiting_requests} requests are waiting")
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in flight")
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        keep_all = trace and self.traces.keep_all(request_id)
        request = EngineCoreRequest(request_id, prompt_token_ids, params,
                                    self.tokenizer.eos_token_id, time.time(), trace, keep_all,
                                    priority, prefill_leader)
        if trace:
            self.tracer.begin(request_id, keep_all)
            self._traced[request_id] = 0
        self.output_processor.add_request(request_id, prompt_token_ids, params)
        if not self._queues:        # the engine was idle: its stall clock starts now
            self._last_progress = time.monotonic()
        self._queues[request_id] = queue
        finished = False
        try:
            self._submit(request)
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if trace:
                self._traced.pop(request_id, None)
                self.tracer.end(request_id)
            if not finished:
                self.output_processor.abort_request(request_id)
                if self._dead is None:
                    self._abort_in_core([request_id])

    async def abort(self, request_id: str) -> None:
        queue = self._queues.pop(request_id, None)
        self.output_processor.abort_request(request_id)
        if queue is not None:
            queue.put_nowait(asyncio.CancelledError(f"request {request_id} aborted"))
        if self._dead is None:
            self._abort_in_core([request_id])

    async def check_health(self) -> None:
        self._check_alive()

    def stalled_for(self) -> float | None:
        if not self._queues or self._dead is not None:
            return None
        return time.monotonic() - self._last_progress

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    async def get_stats(self) -> dict[str, Any]:
        return {**self._stats, "num_in_flight": len(self._queues),
                # Per-request state each process holds: all zero once nothing is in flight.
                "request_state": {"api_streams": len(self._queues),
                                  "api_detokenizers": self.output_processor.num_requests,
                                  "api_traced": len(self._traced),
                                  "core_requests": self._stats.get("core_requests", 0)},
                "step_totals": dict(self._step_totals),
                "engines": [dict(e) for e in self._engine_stats],
                "pids": {"api": os.getpid(), "core": self.core_pid}}

    # -- called by the engines ---------------------------------------------------------------
    def process_engine_outputs(self, outputs: EngineCoreOutputs) -> None:
        """Detokenize, check stop strings, feed each request's stream (lifecycle step 12)."""
        t0 = time.perf_counter()
        self._last_progress = time.monotonic()
        if outputs.trace_events:    # before any stream is fed, so a finished trace is whole
            self.traces.add_all(outputs.trace_events)
        processed = self.output_processor.process_outputs(self._take_failed(outputs.outputs))
        if processed.reqs_to_abort:
            self._abort_in_core(processed.reqs_to_abort)
        for out in processed.request_outputs:
            out.engine_index = outputs.engine_index
            if self._traced and out.request_id in self._traced:
                self._trace_output(out)
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
        if outputs.stats is not None:
            self._update_stats(outputs.stats, outputs.engine_index)
        if outputs.step is not None:
            self._add_step_times(outputs.step, outputs.engine_index)
        self._step_totals["output"] += time.perf_counter() - t0

    def _take_failed(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        """Requests the core failed one by one end with RequestFailedError; the rest go on."""
        if not any(o.error is not None for o in outputs):
            return outputs
        for o in outputs:
            if o.error is not None:
                self.output_processor.abort_request(o.request_id)
                self.fail_request(o.request_id, RequestFailedError(o.error))
        return [o for o in outputs if o.error is None]

    def _trace_output(self, out: RequestOutput) -> None:
        seen = self._traced[out.request_id] = self._traced[out.request_id] + 1
        delta = out.outputs[0]
        self.tracer.event(out.request_id, Step.DETOKENIZED, "detokenized",
                          {"text": delta.text, "tokens": len(delta.token_ids),
                           "finish_reason": delta.finish_reason},
                          where=self.process_engine_outputs, decode=seen > 1)

    def _update_stats(self, s: SchedulerStats, engine: int = 0) -> None:
        self._engine_stats[engine].update(
            num_running=s.num_running, num_waiting=s.num_waiting, kv_cache_usage=s.kv_cache_usage,
            num_free_blocks=s.num_free_blocks, num_total_blocks=s.num_total_blocks,
            num_preemptions=s.num_preemptions, prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits, core_requests=s.num_tracked,
            num_forked_tokens=s.num_forked_tokens)
        self._sum_engine_stats()

    def _sum_engine_stats(self) -> None:
        """The whole server's figures: counts add up; KV usage is the share of all blocks."""
        for key in _SUMMED_STATS:
            self._stats[key] = sum(e[key] for e in self._engine_stats)
        total = self._stats["num_total_blocks"]
        used = sum(e["kv_cache_usage"] * e["num_total_blocks"] for e in self._engine_stats)
        self._stats["kv_cache_usage"] = used / total if total else 0.0

    def add_step_listener(self, listener: Callable[[StepTimes, int], None]) -> None:
        """Call ``listener(times, engine_index)`` for every engine step, as they arrive."""
        self._step_listeners.append(listener)

    def _add_step_times(self, t: StepTimes, engine: int = 0) -> None:
        for phase in _STEP_PHASES:
            self._step_totals[phase] += getattr(t, phase)
        self._step_totals["steps"] += 1
        self._step_totals["tokens"] += t.num_tokens
        for listener in self._step_listeners:
            listener(t, engine)

    def fail_request(self, request_id: str, error: BaseException) -> None:
        """End one request with an error (e.g. the core refused it)."""
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(error)

    def fail_all(self, error: BaseException) -> None:
        """The engine died: every in-flight request ends with this error; new ones get 503."""
        self._dead = error
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(f"engine died: {error}"))

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"engine is dead: {self._dead}")
