"""The steppable engine core both engines drive: schedule -> run the model -> update.

v0 calls ``begin_step`` / ``run_forward`` / ``finish_step`` itself so the forward pass can run
in a worker thread; v1's core process and the offline ``LLM`` call ``step``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shared.config import CacheConfig, EngineConfig
from shared.core.request import Request
from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import SchedulerOutput
from shared.messages import EngineCoreOutputs, EngineCoreRequest, ModelInfo, StepTimes
from shared.structured.compiler import GrammarCompiler
from shared.trace.steps import Step
from shared.trace.tracer import Tracer
from shared.worker.model_fetch import resolve_model
from shared.worker.model_runner import ModelInput, ModelRunner


@dataclass
class StepBatch:
    """A step between its halves: what was scheduled and the tensors built for it."""

    sched: SchedulerOutput
    model_input: ModelInput
    times: StepTimes


class EngineCore:
    """Owns the Scheduler and the ModelRunner. Synchronous; not thread-safe."""

    def __init__(self, config: EngineConfig, model_path: Path | None = None,
                 tracer: Tracer | None = None) -> None:
        path = model_path or resolve_model(config.model.model)
        self.config = config
        # Traced requests' core events (steps 5-11) ride back on this step's outputs.
        self.tracer = tracer or Tracer("engine-core")
        self.model_runner = ModelRunner(config, path)
        runner = self.model_runner
        cache = CacheConfig(block_size=runner.block_size, num_blocks=runner.num_blocks,
                            enable_prefix_caching=config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, cache, runner.max_model_len, self.tracer)
        self._num_forwards = 0
        self.grammars: GrammarCompiler | None = None
        self.model_info = ModelInfo(
            name=path.name, path=str(path),
            max_model_len=runner.max_model_len, vocab_size=runner.arch.vocab_size,
            num_kv_blocks=runner.num_blocks, block_size=runner.block_size,
        )

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a tokenized request; raises RequestTooLongError if it can never fit."""
        req = Request.from_core_request(request)
        spec = request.sampling_params.structured_outputs
        if spec is not None:
            req.grammar = self._grammar_compiler(request.eos_token_id).submit(spec)
        self.scheduler.add_request(req)

    def _grammar_compiler(self, eos_token_id: int | None) -> GrammarCompiler:
        # Made on the first constrained request, so unconstrained serving never builds it.
        if self.grammars is None:
            self.grammars = GrammarCompiler(
                Path(self.model_info.path) / "tokenizer.json", self.model_info.vocab_size,
                eos_token_id, self.config.structured_outputs.grammar_cache_size)
        return self.grammars

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish these requests now and return their KV blocks; unknown ids are ignored."""
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def close(self) -> None:
        """Release what outlives the process's memory: tensor-parallel worker processes."""
        self.model_runner.close()

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model and sample once; returns this step's new tokens."""
        batch = self.begin_step()
        if batch is None:
            return self.outputs_without_step()
        logits = self.run_forward(batch)
        return self.finish_step(batch, logits)

    def begin_step(self) -> StepBatch | None:
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        if sched.is_empty:
            return None
        model_input = self.model_runner.prepare_inputs(sched)
        t2 = time.perf_counter()
        times = StepTimes(schedule=t1 - t0, prepare=t2 - t1, num_tokens=sched.num_scheduled_tokens,
                          num_seqs=len(sched.scheduled))
        if sched.traced:
            self._trace_batch(sched, Step.INPUTS_PREPARED, "inputs prepared",
                              {"batch_tokens": times.num_tokens, "batch_seqs": times.num_seqs,
                               "prepare_ms": round(times.prepare * 1e3, 3)}, self.begin_step)
        return StepBatch(sched, model_input, times)

    def run_forward(self, batch: StepBatch) -> torch.Tensor:
        """The model's forward pass alone: the part v0 moves to a worker thread."""
        self._num_forwards += 1
        fail_after = self.config.model.debug_fail_after_steps
        if fail_after and self._num_forwards > fail_after:
            raise RuntimeError(f"injected forward failure after {fail_after} steps")
        hang_after = self.config.model.debug_hang_after_steps
        while hang_after and self._num_forwards > hang_after:
            time.sleep(1.0)     # a forward that never returns, for the watchdog's tests
        traced = batch.sched.traced
        if traced:
            self._trace_batch(batch.sched, Step.FORWARD, "forward launched",
                              {"batch_tokens": batch.times.num_tokens}, self.run_forward)
        t0 = time.perf_counter()
        logits = self.model_runner.forward(batch.model_input)
        batch.times.forward = time.perf_counter() - t0
        if traced:   # attention (step 10) read each request's K/V through its block table
            self._trace_batch(batch.sched, Step.ATTENTION, "forward done",
                              {"forward_ms": round(batch.times.forward * 1e3, 3)},
                              self.model_runner.attention_fn, kv_read=True)
        return logits

    def finish_step(self, batch: StepBatch, logits: torch.Tensor) -> EngineCoreOutputs:
        t0 = time.perf_counter()
        runner_out = self.model_runner.sample(batch.model_input, logits)
        t1 = time.perf_counter()
        outputs = self.scheduler.update_from_output(batch.sched, runner_out)
        self.scheduler.observe_step(batch.sched, batch.times.forward)
        batch.times.sample = t1 - t0
        batch.times.update = time.perf_counter() - t1
        return self._outputs(outputs, batch.times)

    def outputs_without_step(self) -> EngineCoreOutputs:
        """What a step that scheduled nothing reports: stats, and requests that ended waiting."""
        return self._outputs(self.scheduler.take_unsent_outputs(), None)

    def _outputs(self, outputs: list, times: StepTimes | None) -> EngineCoreOutputs:
        return EngineCoreOutputs(outputs=outputs, timestamp=time.time(),
                                 stats=self.scheduler.get_stats(), step=times,
                                 trace_events=self.tracer.drain())

    def _trace_batch(self, sched: SchedulerOutput, step: Step, name: str, detail: dict,
                     where: Callable[..., Any], kv_read: bool = False) -> None:
        for s in sched.traced or ():
            extra = {"kv_tokens_read": s.start + s.num_new_tokens,
                     "blocks_read": len(s.block_ids)} if kv_read else {}
            self.tracer.event(s.request.request_id, step, name, detail | extra, where=where,
                              decode=s.start >= s.request.num_prompt_tokens)
