"""The HTTP side of lifecycle tracing: which requests are traced, steps 1 and 13, and
``GET /debug/lifecycle[/{request_id}]``.

A request is traced when the server runs with ``--trace`` or it sends
``X-Twinserve-Trace: 1`` (``all`` keeps every decode step; ``0`` opts out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from shared.api.errors import APIError
from shared.config import ServerConfig
from shared.trace import TraceHandle
from shared.trace_store import TraceStore

if TYPE_CHECKING:
    from shared.api.serving import Ctx
    from shared.api.state import AppState

TRACE_HEADER = "x-twinserve-trace"
_ON = {"1", "on", "true", "yes"}
_OFF = {"0", "off", "false", "no"}


def trace_mode(header: str | None, config: ServerConfig) -> str | None:
    """None (not traced), "on" (decode steps summarised) or "all" (every step kept)."""
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
    """One traced HTTP request: marks its steps, links its engine requests, closes it."""

    traces: TraceStore

    def link(self, engine_request_id: str) -> None:
        self.traces.link(engine_request_id, self.request_id)

    def close(self) -> None:
        """However the request ended: drop per-request state, keep the trace (idempotent)."""
        self.tracer.end(self.request_id)
        self.traces.finish(self.request_id)


def start_trace(state: AppState, request: Request, request_id: str) -> HttpTrace | None:
    """Step 1 of a traced request; None (and nothing recorded) when it is not traced."""
    mode = trace_mode(request.headers.get(TRACE_HEADER), state.config)
    if mode is None:
        return None
    state.traces.begin(request_id, keep_all=mode == "all")
    state.tracer.begin(request_id, keep_all=mode == "all")
    state.tracer.event(request_id, 1, "HTTP request received",
                       {"method": request.method, "path": request.url.path, "trace": mode}, depth=2)
    return HttpTrace(state.tracer, request_id, state.traces)


def trace_sent(ctx: Ctx, index: int, num_chunks: int) -> None:
    """Step 13: this output's SSE chunks went out (the generator resumed after them)."""
    assert ctx.trace is not None
    ctx.trace.tracer.event(ctx.id, 13, "SSE chunk sent", {"choice": index, "chunks": num_chunks},
                           decode=ctx.choice(index).num_tokens > 1, depth=2)


def trace_finished(ctx: Ctx, how: str) -> None:
    """The last step-13 event: the response is complete."""
    assert ctx.trace is not None
    tracer = ctx.trace.tracer
    tracer.end(ctx.id)
    reasons = [ctx.choices[i].finish_reason for i in sorted(ctx.choices)]
    tracer.event(ctx.id, 13, "finished", {"response": how, "finish_reasons": reasons,
                                          "completion_tokens": ctx.usage()["completion_tokens"]},
                 depth=2)


def _json(obj: dict[str, Any]) -> Response:
    return Response(msgspec.json.encode(obj), media_type="application/json")


def _state(request: Request) -> AppState:
    return request.app.state.twinserve


async def lifecycle(request: Request) -> Response:
    """One request's events, ``t_ms`` since HTTP received; 404 unless it was traced."""
    st = _state(request)
    request_id = request.path_params["request_id"]
    trace = st.traces.get(request_id)
    if trace is None:
        raise APIError(404, f"no lifecycle trace for {request_id!r}: send the header "
                            f"'X-Twinserve-Trace: 1' or start the server with --trace",
                       param="request_id", code="trace_not_found")
    return _json(trace.to_json(st.config.engine))


async def lifecycle_all(request: Request) -> Response:
    """Every finished trace still in the ring buffer, oldest first."""
    st = _state(request)
    return _json({"engine": st.config.engine,
                  "traces": [t.to_json(st.config.engine) for t in st.traces.finished()]})
