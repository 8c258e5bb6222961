"""n > 1 runs one prefill: the siblings of a request fork its prompt's KV instead of computing it.

The API layer's FanOut is the parent request: choice 0 of a prompt is submitted as usual and
choices 1..n-1 name it as their ``prefill_leader``. The scheduler keeps each sibling waiting
(the requests behind it go on) until the leader has computed all but the last prompt token,
then admits it with ``KVCacheManager.fork``: the leader's full blocks are shared by reference
count, the block holding the last prompt token is copied (``SchedulerOutput.block_copies``,
done by the model runner before the forward), and only that last token is computed, which
gives the sibling its own logits to sample its first token from (with its own seed).

    leader   step 1: prompt 0..P-1 (samples t0)     step 2: t0 ...
    sibling  step 1: waits                          step 2: token P-1 only (samples its t0)

A sibling whose leader is gone, preempted or holds a different prompt is admitted as an
ordinary request (prefix caching may still find the leader's blocks).
"""
from __future__ import annotations

from shared.core.request import Request, RequestStatus


def prefill_leader(req: Request, requests: dict[str, Request]) -> Request | None:
    """The request whose prefill ``req`` waits to fork; None (and forgotten) once a fork
    cannot happen."""
    if req.prefill_leader is None:
        return None
    leader = requests.get(req.prefill_leader)
    if (leader is None or leader.status is RequestStatus.PREEMPTED
            or leader.prompt_token_ids != req.prompt_token_ids
            or req.status is not RequestStatus.WAITING):
        req.prefill_leader = None
        return None
    return leader
