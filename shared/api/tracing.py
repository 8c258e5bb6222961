"""The HTTP side of lifecycle tracing: which requests are traced, and steps 1 and 13.

A request is traced when the server runs with ``--trace`` or it sends
``X-Twinserve-Trace: 1`` (``all`` keeps every decode step; ``0`` opts out).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from shared.api.errors import APIError
from shared.config import ServerConfig
from shared.trace.steps import Step
from shared.trace.store import TraceStore
from shared.trace.tracer import TraceHandle, Tracer

TRACE_HEADER = "x-twinserve-trace"
_ON = {"1", "on", "true", "yes"}
_OFF = {"0", "off", "false", "no"}


def trace_mode(header: str | None, config: ServerConfig) -> str | None:
    """None (not traced), "on" (decode steps summarised) or "all" (every step kept)."""
    if not config.debug_enabled:
        return None         # nobody could read the trace: record nothing
    value = (header or "").strip().lower()
    if value in _OFF or (not value and not config.trace):
        return None
    if value == "all" or config.trace_decode:
        return "all"
    if value and value not in _ON:
        raise APIError(400, f"{TRACE_HEADER} must be 1, all or 0, not {header!r}", param=TRACE_HEADER)
    return "on"


@dataclass
class HttpTrace(TraceHandle):
    """One traced HTTP request: records steps 1 and 13, links its engine requests, closes it.

    Callers pass plain values, so this module needs nothing of the serving code.
    """

    traces: TraceStore

    def received(self, method: str, path: str, mode: str, where: Callable[..., Any]) -> None:
        """Step 1: the request reached its route."""
        self.mark(Step.HTTP_RECEIVED, "HTTP request received",
                  {"method": method, "path": path, "trace": mode}, where=where)

    def link(self, engine_request_id: str) -> None:
        self.traces.link(engine_request_id, self.request_id)

    def sent(self, choice: int, num_chunks: int, decode: bool, where: Callable[..., Any]) -> None:
        """Step 13: this output's SSE chunks went out (the generator resumed after them)."""
        self.tracer.event(self.request_id, Step.STREAMED, "SSE chunk sent",
                          {"choice": choice, "chunks": num_chunks}, where=where, decode=decode)

    def finished(self, how: str, finish_reasons: list[str | None], completion_tokens: int,
                 where: Callable[..., Any]) -> None:
        """The last step-13 event: the response is complete."""
        self.tracer.end(self.request_id)
        self.mark(Step.STREAMED, "finished", {"response": how, "finish_reasons": finish_reasons,
                                             "completion_tokens": completion_tokens}, where=where)

    def close(self) -> None:
        """However the request ended: drop per-request state, keep the trace (idempotent)."""
        self.tracer.end(self.request_id)
        self.traces.finish(self.request_id)


def start_trace(tracer: Tracer, traces: TraceStore, config: ServerConfig, request: Request,
                request_id: str, where: Callable[..., Any]) -> HttpTrace | None:
    """Step 1 of a traced request, recorded by ``where``; None (and nothing recorded) when the
    request is not traced."""
    mode = trace_mode(request.headers.get(TRACE_HEADER), config)
    if mode is None:
        return None
    traces.begin(request_id, keep_all=mode == "all")
    tracer.begin(request_id, keep_all=mode == "all")
    trace = HttpTrace(tracer, request_id, traces)
    trace.received(request.method, request.url.path, mode, where)
    return trace
