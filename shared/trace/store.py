"""The API process's collection of traces: live ones by id, finished ones in a ring buffer.

A trace is keyed by the HTTP response's id (``chatcmpl-...``); with n > 1 or several prompts
the engine requests (``{id}-{index}``) are linked to it, so their core events group under it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from shared.trace.tracer import TraceEvent

DEFAULT_CAPACITY = 256   # finished traces kept for /debug/lifecycle


@dataclass
class RequestTrace:
    request_id: str
    keep_all: bool = False
    events: list[TraceEvent] = field(default_factory=list)
    children: list[str] = field(default_factory=list)    # linked engine request ids

    def to_json(self, engine: str) -> dict[str, Any]:
        """Events in time order; ``t_ms`` counts from the first (HTTP received)."""
        events = sorted(self.events, key=lambda e: e.t_ns)
        t0 = events[0].t_ns if events else 0
        return {"request_id": self.request_id, "engine": engine,
                "events": [event_json(e, t0) for e in events]}


def event_json(e: TraceEvent, t0_ns: int) -> dict[str, Any]:
    out = {"step": e.step, "name": e.name, "t_ms": round((e.t_ns - t0_ns) / 1e6, 3),
           "t_ns": e.t_ns, "pid": e.pid, "process": e.process, "thread": e.thread,
           "where": e.where, "request_id": e.request_id}
    if e.detail is not None:
        out["detail"] = e.detail
    return out


class TraceStore:
    """Collects events of traced requests; only traced requests ever touch it."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._live: dict[str, RequestTrace] = {}
        self._parent: dict[str, str] = {}          # engine request id -> trace id
        self._done: OrderedDict[str, RequestTrace] = OrderedDict()

    def begin(self, trace_id: str, keep_all: bool = False) -> None:
        self._live[trace_id] = RequestTrace(trace_id, keep_all)

    def link(self, request_id: str, trace_id: str) -> None:
        """Group the engine request ``request_id`` under the trace ``trace_id``."""
        trace = self._live.get(trace_id)
        if trace is not None:
            trace.children.append(request_id)
            self._parent[request_id] = trace_id

    def keep_all(self, request_id: str) -> bool:
        trace = self._live.get(self._parent.get(request_id, request_id))
        return trace is not None and trace.keep_all

    def add(self, event: TraceEvent) -> None:
        """Append to its live trace; events of unknown or finished requests are dropped."""
        trace = self._live.get(self._parent.get(event.request_id, event.request_id))
        if trace is not None:
            trace.events.append(event)

    def add_all(self, events: list[TraceEvent]) -> None:
        for event in events:
            self.add(event)

    def finish(self, trace_id: str) -> None:
        """Move a live trace to the ring buffer (idempotent); the oldest falls out."""
        trace = self._live.pop(trace_id, None)
        if trace is None:
            return
        for rid in trace.children:
            self._parent.pop(rid, None)
        self._done[trace_id] = trace
        while len(self._done) > self.capacity:
            self._done.popitem(last=False)

    def get(self, trace_id: str) -> RequestTrace | None:
        return self._done.get(trace_id) or self._live.get(trace_id)

    def finished(self) -> list[RequestTrace]:
        return list(self._done.values())

    @property
    def num_live(self) -> int:
        return len(self._live)
