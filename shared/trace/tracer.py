"""Lifecycle tracing: a traced request records one TraceEvent per step of the lifecycle map.

Each process has one ``Tracer`` (passed to the components that record, never global).
Events carry a wall-clock timestamp (``time.time_ns``: comparable across the API and core
processes, unlike ``perf_counter``), the process, the thread and the code location.

Decode steps repeat the same events once per token, so by default only the first decode step
of a request is kept in full; later ones are folded into one summary event per component,
with a count and the total time per phase. A phase's time is the time since the request's
previous event in the same Tracer, so for events that mark the end of a phase
("forward done") it is that phase's duration.

The cost with tracing off is the caller's ``if request.trace:`` check; nothing here runs.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.trace.steps import Step

SUMMARY_NAME = "later decode steps (summary)"


class TraceEvent(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step of one request, as seen by one process and thread."""

    request_id: str
    step: int                 # 1-13, a Step: the lifecycle map's row
    name: str
    t_ns: int                 # time.time_ns(): one clock for all processes on the machine
    pid: int
    process: str
    thread: str
    where: str                # "module:function" that recorded it
    detail: dict[str, Any] | None = None


@dataclass
class _Phase:
    count: int = 0
    total_ns: int = 0


@dataclass
class _Summary:
    """Later decode steps of one request, folded per event name."""

    first: TraceEvent
    last_ns: int = 0
    phases: dict[str, _Phase] = field(default_factory=dict)

    def add(self, name: str, gap_ns: int, t_ns: int) -> None:
        phase = self.phases.setdefault(name, _Phase())
        phase.count += 1
        phase.total_ns += gap_ns
        self.last_ns = t_ns

    def to_event(self) -> TraceEvent:
        steps = sorted({self.first.step} | {int(n.split(":", 1)[0]) for n in self.phases})
        phases = {n.split(":", 1)[1]: {"count": p.count, "total_ms": round(p.total_ns / 1e6, 3)}
                  for n, p in self.phases.items()}
        detail = {"steps": [steps[0], steps[-1]], "count": max(p.count for p in self.phases.values()),
                  "span_ms": round((self.last_ns - self.first.t_ns) / 1e6, 3), "phases": phases}
        return msgspec.structs.replace(self.first, step=steps[0], name=SUMMARY_NAME, detail=detail)


@dataclass
class _RequestState:
    keep_all: bool
    last_ns: int
    seen_decode: set[int] = field(default_factory=set)
    summary: _Summary | None = None


class Tracer:
    """Records events of traced requests in one process.

    Events wait in a thread-safe queue until ``drain`` (the engine core ships them with its
    outputs), or go straight to ``sink`` when one is given (the API process's TraceStore).
    """

    def __init__(self, process: str, sink: Any = None) -> None:
        self.process = process
        self.pid = os.getpid()
        self._sink = sink
        self._pending: deque[TraceEvent] = deque()
        self._requests: dict[str, _RequestState] = {}

    def begin(self, request_id: str, keep_all: bool = False) -> None:
        """Start per-request state: decode summaries and phase times need it."""
        self._requests[request_id] = _RequestState(keep_all, time.time_ns())

    def event(self, request_id: str, step: Step, name: str, detail: dict[str, Any] | None = None,
              *, where: Callable[..., Any], decode: bool = False) -> None:
        """Record ``step`` of ``request_id``, done by the function ``where``; ``decode`` marks a
        per-token repeat. ``where`` is passed, not read off the stack, so moving the call into
        a helper cannot change what the trace reports."""
        now = time.time_ns()
        ev = TraceEvent(request_id, int(step), name, now, self.pid, self.process,
                        threading.current_thread().name, code_location(where), detail)
        state = self._requests.get(request_id)
        if state is None:
            self._emit(ev)
            return
        gap, state.last_ns = now - state.last_ns, now
        if decode and step in state.seen_decode and not state.keep_all:
            if state.summary is None:
                state.summary = _Summary(ev)
            state.summary.add(f"{step}:{name}", gap, now)
            return
        if decode:
            state.seen_decode.add(step)
        self._emit(ev)

    def end(self, request_id: str) -> None:
        """The request is done in this process: emit its decode summary, drop its state."""
        state = self._requests.pop(request_id, None)
        if state is not None and state.summary is not None:
            self._emit(state.summary.to_event())

    def drain(self) -> list[TraceEvent] | None:
        """Events recorded since the last drain; None (no allocation) when there are none."""
        if not self._pending:
            return None
        out = []
        try:
            while True:
                out.append(self._pending.popleft())
        except IndexError:     # another thread may append meanwhile; the next drain takes it
            return out

    @property
    def num_active(self) -> int:
        return len(self._requests)

    def _emit(self, ev: TraceEvent) -> None:
        if self._sink is not None:
            self._sink(ev)
        else:
            self._pending.append(ev)


def code_location(fn: Callable[..., Any]) -> str:
    """``module:Qualified.name`` of a function or bound method."""
    fn = getattr(fn, "__func__", fn)
    return f"{fn.__module__}:{fn.__qualname__}"


@dataclass
class TraceHandle:
    """A Tracer bound to one request id, for code that should not know the id (prepare)."""

    tracer: Tracer
    request_id: str

    def mark(self, step: Step, name: str, detail: dict[str, Any] | None = None, *,
             where: Callable[..., Any]) -> None:
        self.tracer.event(self.request_id, step, name, detail, where=where)
