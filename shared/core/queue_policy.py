"""Where a request enters the scheduler's queues: fcfs or priority (vLLM's two policies).

Both queues stay plain sequences that the scheduler walks by index, so skipping a request whose
grammar still compiles works the same under either policy.

    fcfs      waiting: arrival order, a preempted request back at the head
              running: admission order; the tail (newest) is preempted first
    priority  waiting and running: sorted by (priority, arrival_time, seq), lower first;
              the running tail (lowest priority, newest) is preempted first, and a preempted
              request goes back to its sorted place

Keeping ``running`` sorted makes the preemption victim the tail under both policies, so a
victim is never a request already scheduled in this step (it comes after the one being
scheduled), and the token budget goes to higher priorities first.
"""
from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import MutableSequence

from shared.core.request import Request
from shared.errors import ParamError


def priority_key(req: Request) -> tuple[int, float, int]:
    """Lower runs first; ties by arrival, then by the order requests were queued."""
    return req.priority, req.arrival_time, req.seq


class QueuePolicy:
    """Inserts into the waiting deque and the running list; the scheduler removes.

    ``name`` is ``SchedulerConfig.scheduling_policy`` (checked there): fcfs or priority.
    """

    def __init__(self, name: str) -> None:
        self.by_priority = name == "priority"
        self._seq = itertools.count()

    def check(self, req: Request) -> None:
        """Refuse what this policy cannot honour (vLLM refuses priorities under fcfs too)."""
        if req.priority != 0 and not self.by_priority:
            raise ParamError(f"priority {req.priority} needs the server to run with "
                             "--scheduling-policy priority (this one runs fcfs)", param="priority")

    def enqueue(self, waiting: deque[Request], req: Request) -> None:
        """A new request."""
        req.seq = next(self._seq)
        self._insert(waiting, req, at_head=False)

    def requeue(self, waiting: deque[Request], req: Request) -> None:
        """A preempted request: fcfs puts it before everyone else, priority in its place."""
        self._insert(waiting, req, at_head=True)

    def admit(self, running: list[Request], req: Request) -> None:
        self._insert(running, req, at_head=False)

    def _insert(self, queue: MutableSequence[Request], req: Request, at_head: bool) -> None:
        if self.by_priority:
            bisect.insort(queue, req, key=priority_key)
        elif at_head:
            queue.insert(0, req)
        else:
            queue.append(req)
