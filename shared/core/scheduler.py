"""Continuous batching under a token budget (lifecycle steps 5, 6 and 11).

There are no prefill and decode phases: every request has ``num_tokens`` known tokens (prompt +
outputs) of which ``num_computed_tokens`` sit in the KV cache, and each step computes up to
``num_tokens - num_computed_tokens`` more of them. A long prompt thus fills in chunks across
steps while other requests keep decoding, and a preempted request recomputes the same way.

    prompt 10, budget 4 per step, block_size 4:
      step 1  computes 0..3    step 2  computes 4..7    step 3  computes 8..9, samples t10
      step 4  computes t10, samples t11  ...
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

from shared.config import CacheConfig, SchedulerConfig
from shared.core.admission import check_fits, max_output_tokens
from shared.core.kv_cache import KVCacheManager
from shared.core.prefill_fork import prefill_leader
from shared.core.prefill_pacer import DEFAULT_FLOOR, PrefillPacer
from shared.core.queue_policy import QueuePolicy
from shared.core.request import Request, RequestStatus
from shared.core.sched_trace import trace_finished, trace_queued, trace_sampled, trace_scheduled
from shared.core.scheduler_output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from shared.core.stop import check_stop
from shared.messages import EngineCoreOutput, SchedulerStats, TokenLogprobs
from shared.trace.tracer import Tracer

logger = logging.getLogger(__name__)


class Scheduler:
    """Picks each step's batch, owns the KV cache bookkeeping and decides when requests stop."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 max_model_len: int, tracer: Tracer | None = None) -> None:
        if cache_config.num_blocks is None:
            raise ValueError("cache_config.num_blocks must be resolved before building a Scheduler")
        self.config = scheduler_config
        # Most tokens of one prompt per step (vLLM's long_prefill_token_threshold; 0: the budget).
        cfg = scheduler_config
        self._chunk_cap = cfg.long_prefill_token_threshold or cfg.max_num_batched_tokens
        # Prompt tokens a step may carry while others decode (the engine feeds it step times).
        budget = cfg.max_num_batched_tokens
        self.pacer = PrefillPacer(cfg.prefill_step_ratio, min(DEFAULT_FLOOR, budget), budget,
                                  cfg.prefill_pace_threshold)
        self._prompt_left = 0                       # of the pacer's cap, in this schedule()
        self.max_model_len = max_model_len
        self.kv_cache_manager = KVCacheManager(cache_config.num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}     # every unfinished request
        self.policy = QueuePolicy(scheduler_config.scheduling_policy)   # the queues' order
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []           # the last is the first preemption victim
        self.num_preemptions = 0
        self.num_forked_tokens = 0                 # prompt tokens n > 1 siblings did not compute
        self._finished_ids: list[str] = []         # since the last non-empty schedule()
        # Requests that ended while waiting (a grammar that failed to compile): sent next step.
        self._unsent: list[EngineCoreOutput] = []
        self.tracer = tracer or Tracer("engine-core")

    # -- add_request / abort_requests -------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; raises RequestTooLongError if it could never run."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        check_fits(request, self.max_model_len, self.kv_cache_manager)
        self.policy.check(request)
        request.max_output_tokens = max_output_tokens(request, self.max_model_len,
                                                      self.kv_cache_manager)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.policy.enqueue(self.waiting, request)
        if request.trace:
            trace_queued(self.tracer, request, len(self.waiting), self.add_request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        """Finish these requests now and free their blocks; unknown ids are ignored."""
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if req.status is RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            aborted.append(req)
        return aborted

    # -- schedule ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """This step's batch: running requests first, in order, then waiting ones in order."""
        out = SchedulerOutput(finished_ids=list(self._finished_ids))
        self._prompt_left = self.pacer.step_cap(self.running)
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted_ids:   # blocks are short: let running requests catch up first
            self._schedule_waiting(out, budget)
        out.num_scheduled_tokens = sum(s.num_new_tokens for s in out.scheduled)
        if out.scheduled:
            # An empty step never reaches the runner: keep the ids for the next real one.
            self._finished_ids = []
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        kv = self.kv_cache_manager
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget, self._chunk_cap)
            if num_new > 1:      # a prompt (or recompute) chunk: within the pacer's cap
                num_new = self._paced(req, num_new)
            if num_new <= 0:     # not sampled last step, or the step's prompt tokens are spent
                i += 1
                continue
            while not kv.allocate_slots(req, num_new):
                # Victims come from the tail (QueuePolicy keeps it the newest or the lowest
                # priority), so they were not scheduled yet in this step.
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    return budget
            self._add_scheduled(out, req, num_new)
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[i]
            leader = prefill_leader(req, self.requests)
            if ((req.grammar is not None and not self._grammar_ready(req))
                    or (leader is not None and leader.num_computed_tokens < req.num_prompt_tokens - 1)):
                i += 1  # grammar compiling, or n > 1 leader prefilling: the requests behind go on
                continue
            num_new = self._fork(i, leader, out, budget) if leader else self._admit(i, out, budget)
            if num_new == 0:
                break    # nobody overtakes the first request that can run (either policy)
            budget -= num_new

    def _grammar_ready(self, req: Request) -> bool:
        assert req.grammar is not None
        if not req.grammar.ready():
            return False
        if req.grammar.error is None:
            return True
        self._unsent.append(self._fail(req, f"grammar error: {req.grammar.error}"))
        return False

    def _fail(self, req: Request, message: str) -> EngineCoreOutput:
        """End one request with an error (its own fault); the batch and the engine go on."""
        logger.error("request %s failed in the core: %s", req.request_id, message)
        if req.status is RequestStatus.WAITING or req.status is RequestStatus.PREEMPTED:
            self.waiting.remove(req)
        self._finish(req, RequestStatus.FINISHED_ABORTED)   # running: filtered out by the caller
        return EngineCoreOutput(req.request_id, [], finish_reason="abort", error=message)

    def take_unsent_outputs(self) -> list[EngineCoreOutput]:
        """Outputs of requests that finished outside a step (see ``_grammar_ready``)."""
        unsent, self._unsent = self._unsent, []
        return unsent

    def _fork(self, index: int, leader: Request, out: SchedulerOutput, budget: int) -> int:
        """Admit ``waiting[index]`` on its leader's prompt KV (see prefill_fork.py); 1 token."""
        req = self.waiting[index]
        if leader.status is not RequestStatus.RUNNING:
            return 0        # still waiting itself (it is ahead in the queue)
        num_done = req.num_prompt_tokens - 1
        copies = self.kv_cache_manager.fork(req, leader, num_done)
        if copies is None:
            return 0
        req.prefill_leader = None
        self.num_forked_tokens += num_done
        out.block_copies.extend(copies)
        # Forking is not a prefix-cache hit: the leader's own hits are the prompt's.
        self._start(index, out, num_done, 1, leader.num_cached_tokens)
        return 1

    def _admit(self, index: int, out: SchedulerOutput, budget: int) -> int:
        """Move ``waiting[index]`` to running if its blocks fit; tokens scheduled."""
        req = self.waiting[index]
        kv = self.kv_cache_manager
        hits, num_hit = kv.get_computed_blocks(req)
        num_new = min(req.num_tokens - num_hit, budget, self._chunk_cap)
        paced = num_new > 1 and self.pacer.paces(req)
        if paced:
            num_new = min(num_new, self._prompt_left)
        if num_new <= 0 or not kv.allocate_slots(req, num_new, hits):
            return 0    # the step's prompt tokens are spent, or its blocks do not fit
        if paced:
            self._prompt_left -= num_new
        self._start(index, out, num_hit, num_new, num_hit)
        return num_new

    def _paced(self, req: Request, num_new: int) -> int:
        """A running request's chunk of ``num_new`` tokens, within what is left of the pacer's
        cap when it paces ``req`` (the cap is taken at once: a chunk that then does not fit
        preempts until it does, or the request is itself preempted and the step ends)."""
        if not self.pacer.paces(req):
            return num_new
        num_new = min(num_new, self._prompt_left)
        self._prompt_left -= num_new
        return num_new

    def _start(self, index: int, out: SchedulerOutput, num_done: int, num_new: int,
               num_cached: int) -> None:
        """``waiting[index]``, its blocks in hand with ``num_done`` tokens' KV, runs now."""
        req = self.waiting[index]
        del self.waiting[index]
        if req.status is RequestStatus.WAITING:     # first admission, not a resume
            req.num_cached_tokens = num_cached
            req.scheduled_at = time.monotonic()
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_done
        self.policy.admit(self.running, req)
        self._add_scheduled(out, req, num_new, num_done)

    def _add_scheduled(self, out: SchedulerOutput, req: Request, num_new: int,
                       num_hit: int = 0) -> None:
        block_ids = self.kv_cache_manager.get_block_ids(req.request_id)
        s = ScheduledRequest(req, req.num_computed_tokens, num_new, block_ids)
        out.scheduled.append(s)
        if req.trace:
            trace_scheduled(self.tracer, out, s, num_hit, len(self.running),
                            self.kv_cache_manager, self.schedule)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Recompute later: drop its KV, keep its outputs, queue it first (fcfs) or in place."""
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.prompt_logprobs = []        # the recompute scores the prompt again, if still owed
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.policy.requeue(self.waiting, req)
        out.preempted_ids.append(req.request_id)

    # -- update_from_output -----------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance progress, append sampled tokens, finish stopped requests; new tokens out."""
        kv = self.kv_cache_manager
        outputs = self.take_unsent_outputs()
        for s in scheduler_output.scheduled:
            req = s.request
            if req.status is not RequestStatus.RUNNING:
                continue    # aborted while the step ran: its blocks are gone already
            samples = s.samples
            req.num_computed_tokens += s.num_new_tokens
            kv.cache_blocks(req)
            if req.request_id in runner_output.prompt_logprobs:
                req.prompt_logprobs.extend(runner_output.prompt_logprobs[req.request_id])
            token = runner_output.sampled_token_ids.get(req.request_id) if samples else None
            failed = runner_output.failed.get(req.request_id)
            if failed is not None:
                outputs.append(self._fail(req, failed))
            elif token is not None:
                logprobs = runner_output.logprobs.get(req.request_id)
                try:
                    outputs.append(self._append_token(req, token, logprobs))
                except Exception as exc:  # noqa: BLE001 - one request's fault fails it alone
                    outputs.append(self._fail(req, f"{type(exc).__name__}: {exc}"))
        if any(r.status.finished for r in self.running):
            self.running = [r for r in self.running if not r.status.finished]
        return outputs

    def _append_token(self, req: Request, token: int, logprobs: TokenLogprobs | None) -> EngineCoreOutput:
        seed = req.sampling_params.seed
        if seed is not None and seed == self.config.debug_fail_request_seed:
            raise RuntimeError("injected per-request fault (--debug-fail-request-seed)")
        prompt_lps, first = None, req.num_output_tokens == 0
        if first and req.sampling_params.prompt_logprobs is not None:
            prompt_lps, req.prompt_logprobs = [None, *req.prompt_logprobs], []
        req.append_output_token(token)
        if logprobs is not None:
            req.output_logprobs.append(logprobs)
        if req.trace:
            trace_sampled(self.tracer, req, token, self.update_from_output)
        status = check_stop(req, token, self.max_model_len)
        if status is not None:
            self._finish(req, status)
        return EngineCoreOutput(
            request_id=req.request_id, new_token_ids=[token],
            new_logprobs=None if logprobs is None else [logprobs],
            finish_reason=req.status.finish_reason, stop_reason=req.stop_reason,
            num_cached_tokens=req.num_cached_tokens, prompt_logprobs=prompt_lps,
            times=req.first_token_times() if first else None)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        """Mark finished and free the blocks now; the caller takes it out of its queue."""
        req.status = status
        num_blocks = len(self.kv_cache_manager.get_block_ids(req.request_id)) if req.trace else 0
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]
        if req.trace:
            trace_finished(self.tracer, req, num_blocks, self.update_from_output)
        self._finished_ids.append(req.request_id)

    def observe_step(self, scheduler_output: SchedulerOutput, forward_seconds: float) -> None:
        """A finished step's forward time, from which the pacer adjusts its prompt-token cap."""
        self.pacer.observe_step(scheduler_output, forward_seconds)

    # -- queries ----------------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def get_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running=self.num_running, num_waiting=self.num_waiting,
            num_free_blocks=kv.num_free_blocks, num_total_blocks=kv.num_blocks,
            kv_cache_usage=kv.usage, prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits, num_preemptions=self.num_preemptions,
            num_tracked=len(self.requests), num_forked_tokens=self.num_forked_tokens)
