"""Lifecycle-trace events the scheduler records for traced requests (steps 6, 7 and 11)."""
from __future__ import annotations

from collections.abc import Callable

from shared.core.kv_cache import KVCacheManager
from shared.core.request import Request
from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.trace.steps import Step
from shared.trace.tracer import Tracer


def trace_queued(tracer: Tracer, req: Request, num_waiting: int, where: Callable) -> None:
    tracer.begin(req.request_id, req.trace_decode)
    tracer.event(req.request_id, Step.QUEUED, "queued",
                 {"prompt_tokens": req.num_prompt_tokens, "waiting": num_waiting}, where=where)


def trace_scheduled(tracer: Tracer, out: SchedulerOutput, s: ScheduledRequest, num_hit: int,
                    num_running: int, kv: KVCacheManager, where: Callable) -> None:
    """Picked for this batch, blocks in hand; ``num_hit``: prompt tokens it did not compute
    (a prefix-cache hit, or a fork of its n > 1 leader's prompt)."""
    if out.traced is None:
        out.traced = []
    out.traced.append(s)
    rid, decode = s.request.request_id, s.start >= s.request.num_prompt_tokens
    tracer.event(rid, Step.SCHEDULED, "scheduled",
                 {"new_tokens": s.num_new_tokens, "computed": s.start, "running": num_running},
                 where=where, decode=decode)
    tracer.event(rid, Step.KV_ALLOCATED, "KV blocks allocated",
                 {"blocks": len(s.block_ids), "free_blocks": kv.num_free_blocks,
                  "prefix_hit_tokens": num_hit}, where=kv.allocate_slots, decode=decode)


def trace_sampled(tracer: Tracer, req: Request, token: int, where: Callable) -> None:
    tracer.event(req.request_id, Step.SAMPLED, "token sampled",
                 {"token_id": token, "output_tokens": req.num_output_tokens},
                 where=where, decode=req.num_output_tokens > 1)


def trace_finished(tracer: Tracer, req: Request, num_blocks: int, where: Callable) -> None:
    tracer.end(req.request_id)
    tracer.event(req.request_id, Step.SAMPLED, "finished in the core, KV blocks freed",
                 {"reason": req.status.finish_reason, "blocks_freed": num_blocks}, where=where)
