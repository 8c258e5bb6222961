"""Small factories for scheduler tests, and a fake model that reads its history through the KV cache.

The fake model keeps one (position, token) pair per KV slot. Each step it writes the scheduled
tokens into their slots and reads the whole sequence back through the block table, so a wrong
block table, a block reused too early or a bad prefix hit changes the "sampled" token.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shared.config import CacheConfig, SchedulerConfig
from shared.core.request import Request
from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from shared.messages import EngineCoreOutput, SamplingParams

TokenFn = Callable[[list[int]], int]


def make_request(rid: str, prompt: list[int] | int, max_tokens: int | None = 16,
                 eos_token_id: int | None = None, priority: int = 0, arrival_time: float = 0.0,
                 prefill_leader: str | None = None, **params: object) -> Request:
    """``prompt`` is a token list, or a length (tokens derived from the id, so ids differ)."""
    if isinstance(prompt, int):
        base = sum(ord(c) for c in rid) * 7
        prompt = [(base + i * 13) % 1000 + 1 for i in range(prompt)]
    params.setdefault("temperature", 0.0)
    sp = SamplingParams(max_tokens=max_tokens, **params)
    return Request(rid, prompt, sp, eos_token_id=eos_token_id, arrival_time=arrival_time,
                   priority=priority, prefill_leader=prefill_leader)


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 64, max_model_len: int = 512,
                   enable_prefix_caching: bool = True, scheduling_policy: str = "fcfs",
                   long_prefill_token_threshold: int = 0,
                   prefill_step_ratio: float = 2.0,
                   prefill_pace_threshold: int = 0) -> Scheduler:
    sched_cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                scheduling_policy=scheduling_policy,
                                long_prefill_token_threshold=long_prefill_token_threshold,
                                prefill_step_ratio=prefill_step_ratio,
                                prefill_pace_threshold=prefill_pace_threshold)
    cache_cfg = CacheConfig(block_size=block_size, num_blocks=num_blocks,
                            enable_prefix_caching=enable_prefix_caching)
    return Scheduler(sched_cfg, cache_cfg, max_model_len)


def history_token(history: list[int]) -> int:
    """A deterministic 'next token' that depends on the whole history (never 0)."""
    h = 17
    for t in history:
        h = (h * 31 + t) % 1_000_003
    return h % 997 + 1


def runner_output(sched_out: SchedulerOutput, tokens: dict[str, int]) -> ModelRunnerOutput:
    """Runner output giving ``tokens[rid]`` to each scheduled request that samples."""
    return ModelRunnerOutput(sampled_token_ids={
        s.request.request_id: tokens[s.request.request_id]
        for s in sched_out.scheduled if s.samples and s.request.request_id in tokens})


@dataclass
class FakeModel:
    block_size: int
    token_fn: TokenFn = history_token
    kv: dict[int, tuple[int, int]] = field(default_factory=dict)   # slot -> (position, token)

    def execute(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        bs = self.block_size
        for src, dst in sched_out.block_copies:     # as the model runner does, before the forward
            for i in range(bs):
                if src * bs + i in self.kv:
                    self.kv[dst * bs + i] = self.kv[src * bs + i]
        sampled = {}
        for s in sched_out.scheduled:
            history = self._write_and_read(s.request.all_token_ids, s.start, s.num_new_tokens, s.block_ids)
            if s.samples:
                sampled[s.request.request_id] = self.token_fn(history)
        return ModelRunnerOutput(sampled_token_ids=sampled)

    def _write_and_read(self, tokens: list[int], start: int, n: int, table: list[int]) -> list[int]:
        bs = self.block_size
        assert len(table) * bs >= start + n, "block table does not cover the scheduled tokens"
        slot = [table[p // bs] * bs + p % bs for p in range(start + n)]
        for p in range(start, start + n):
            self.kv[slot[p]] = (p, tokens[p])
        history = []
        for p in range(start + n):
            pos, tok = self.kv.get(slot[p], (-1, -1))
            assert pos == p, f"slot {slot[p]} holds position {pos}, expected {p}"
            history.append(tok)
        return history


@dataclass
class RunLog:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finish_order: list[str] = field(default_factory=list)
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    steps: list[SchedulerOutput] = field(default_factory=list)
    core_outputs: list[list[EngineCoreOutput]] = field(default_factory=list)


def run_step(scheduler: Scheduler, model: FakeModel, log: RunLog) -> None:
    sched_out = scheduler.schedule()
    outs = scheduler.update_from_output(sched_out, model.execute(sched_out))
    log.steps.append(sched_out)
    log.core_outputs.append(outs)
    for o in outs:
        log.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finish_reason is not None:
            log.finish_order.append(o.request_id)
            log.finish_reasons[o.request_id] = o.finish_reason


def run_until_done(scheduler: Scheduler, model: FakeModel | None = None, max_steps: int = 10_000,
                   log: RunLog | None = None) -> RunLog:
    model = model or FakeModel(scheduler.kv_cache_manager.block_size)
    log = log or RunLog()
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return log
        run_step(scheduler, model, log)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")
