"""The flow both generation endpoints share: validate, fan out, then stream or collect.

Subclasses (serving_chat.py, serving_completion.py) only decode their request and shape
OpenAI's JSON; this module owns the request lifecycle, disconnects and error events.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from shared.api.errors import to_api_error
from shared.api.fanout import FanOut
from shared.api.httputil import ClientGone, read_body, unless_disconnected
from shared.api.logprobs import CompletionLogprobs
from shared.api.requests import Prepared
from shared.api.state import AppState
from shared.api.tracing import HttpTrace, start_trace
from shared.frontend.outputs import RequestOutput
from shared.messages import TokenLogprobs
from shared.trace.tracer import TraceHandle


@dataclass
class Choice:
    """What one choice has produced so far (streaming and non-streaming)."""

    index: int
    started: bool = False
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    legacy_lp: CompletionLogprobs | None = None   # completions only
    legacy_blocks: list[dict] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None   # on the first output
    tool_calls: Any = None      # chat with tools: a ToolCallsState


@dataclass
class Ctx:
    """One HTTP request's identity and its choices."""

    id: str
    created: int
    model: str
    prepared: Prepared
    choices: dict[int, Choice] = field(default_factory=dict)
    trace: HttpTrace | None = None        # set when this request's lifecycle is traced
    cached: dict[int, int] = field(default_factory=dict)   # job index -> prefix-cache hit tokens

    def choice(self, index: int) -> Choice:
        if index not in self.choices:
            self.choices[index] = Choice(index)
        return self.choices[index]

    def observe(self, index: int, out: RequestOutput) -> None:
        """What every endpoint records of an output before shaping it: cache hits, prompt lps."""
        job = index // self.prepared.n
        self.cached[job] = max(self.cached.get(job, 0), out.num_cached_tokens)
        if out.prompt_logprobs is not None:
            self.choice(index).prompt_logprobs = out.prompt_logprobs

    def usage(self) -> dict:
        prompt = sum(len(job.prompt_ids) for job in self.prepared.jobs)
        completion = sum(c.num_tokens for c in self.choices.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


def finish_reason(out: RequestOutput) -> str | None:
    if not out.finished:
        return None
    return out.outputs[0].finish_reason or "stop"


def encode(obj: dict) -> str:
    # msgspec writes non-finite floats (a -inf logprob) as null, keeping the JSON valid.
    return msgspec.json.encode(obj).decode()


def json_response(obj: dict, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


class _FanOutSSE(EventSourceResponse):
    """An SSE response that always releases its engine requests, however the stream ends."""

    def __init__(self, content: AsyncIterator[str], fan: FanOut) -> None:
        super().__init__(content, sep="\n", send_timeout=30)
        self._fan = fan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._fan.close()


class Serving:
    id_prefix = ""
    id_sep = "-"

    def __init__(self, state: AppState) -> None:
        self.state = state

    def prepare(self, body: bytes, trace: TraceHandle | None = None) -> Prepared:
        raise NotImplementedError

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        """Record a delta in ``ctx``; return the stream chunks it produces."""
        raise NotImplementedError

    def full_response(self, ctx: Ctx) -> dict:
        raise NotImplementedError

    def usage_chunk(self, ctx: Ctx) -> dict:
        raise NotImplementedError

    async def __call__(self, request: Request) -> Response:
        request_id = f"{self.id_prefix}{self.id_sep}{uuid.uuid4().hex}"
        st = self.state
        trace = start_trace(st.tracer, st.traces, st.config, request, request_id, self.__call__)
        try:
            body = await read_body(request, self.state.config.max_body_bytes,
                                   self.state.config.timeout_body)
            prepared = self.prepare(body, trace)
        except Exception:
            if trace is not None:   # a refused request keeps its partial trace
                trace.close()
            raise
        ctx = Ctx(request_id, int(time.time()), self.state.model_name, prepared, trace=trace)
        fan = FanOut(self.state.engine, ctx.id, prepared.jobs, prepared.n, self.state.metrics,
                     self.state.inflight, trace=trace).start()
        streaming = False
        try:
            # Wait for the first output before answering, so queue-full and engine errors
            # still get their HTTP status instead of an SSE error event.
            first = await unless_disconnected(request, fan.next())
            if prepared.stream:
                streaming = True
                return _FanOutSSE(self._events(ctx, first, fan), fan)
            await unless_disconnected(request, self._collect(ctx, first, fan))
            response = json_response(self.full_response(ctx))
            if ctx.trace is not None:
                self._trace_finished(ctx, "JSON", self.__call__)
            return response
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the engine work is aborted
        finally:
            if not streaming:
                fan.close()

    async def _collect(self, ctx: Ctx, item: tuple[int, RequestOutput] | None, fan: FanOut) -> None:
        while item is not None:
            ctx.observe(*item)
            self.on_output(ctx, *item)
            item = await fan.next()

    async def _events(self, ctx: Ctx, item: tuple[int, RequestOutput] | None,
                      fan: FanOut) -> AsyncIterator[str]:
        try:
            while item is not None:
                ctx.observe(*item)
                chunks = self.on_output(ctx, *item)
                for chunk in chunks:
                    if ctx.prepared.continuous_usage:   # vLLM's usage-so-far on every chunk
                        chunk["usage"] = ctx.usage()
                    yield encode(chunk)
                if ctx.trace is not None:
                    ctx.trace.sent(item[0], len(chunks), ctx.choice(item[0]).num_tokens > 1,
                                   self._events)
                item = await fan.next()
            if ctx.prepared.include_usage:
                yield encode(self.usage_chunk(ctx))
            if ctx.trace is not None:
                self._trace_finished(ctx, "SSE", self._events)
        except Exception as exc:  # after the headers went out, errors travel as an SSE event
            yield encode(to_api_error(exc).body())
        finally:
            fan.close()
        yield "[DONE]"

    @staticmethod
    def _trace_finished(ctx: Ctx, how: str, where: Callable[..., Any]) -> None:
        assert ctx.trace is not None
        reasons = [ctx.choices[i].finish_reason for i in sorted(ctx.choices)]
        ctx.trace.finished(how, reasons, ctx.usage()["completion_tokens"], where)
