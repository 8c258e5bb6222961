"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over chat generation.

The output items (a message with one output_text part, function calls when the request has
tools) are built by responses_output.py. Streaming sends OpenAI's typed events (``event:`` line and ``type`` field, a ``sequence_number`` on each) and no
[DONE]. Stored responses live in a bounded in-memory store (responses_input.py).
"""
from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from shared.api.errors import to_api_error
from shared.api.fanout import FanOut
from shared.api.protocol import CompletionRequest, ResponsesRequest, decode_body
from shared.api.requests import Job, Prepared, check_model, fit_context, render_chat, sampling_params
from shared.api.responses_input import (
    ResponseStore,
    Stored,
    input_messages,
    plan_tools,
    response_format,
    text_format_param,
)
from shared.api.responses_output import OutputItems
from shared.api.serving import Ctx, Serving, encode, finish_reason, json_response
from shared.api.state import AppState
from shared.errors import ParamError
from shared.frontend.outputs import RequestOutput
from shared.structured.grammar import validate
from shared.trace.tracer import TraceHandle


@dataclass
class ResponsesPrepared(Prepared):
    req: ResponsesRequest | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    items: OutputItems | None = None
    final: dict[str, Any] | None = None      # the finished response object


class ResponsesServing(Serving):
    id_prefix = "resp"
    id_sep = "_"

    def __init__(self, state: AppState) -> None:
        super().__init__(state)
        self.store = ResponseStore(state.config.responses_store_size)

    def prepare(self, body: bytes, trace: TraceHandle | None = None) -> Prepared:
        req = decode_body(body, ResponsesRequest)
        check_model(req.model, self.state.accepted_models)
        self.store.check_store(req.store)
        tools = plan_tools(req)
        history = []
        if req.previous_response_id is not None:
            history = self.store.get(req.previous_response_id, "previous_response_id").conversation
        conversation = [*history, *input_messages(req)]
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        engine, cfg = self.state.engine, self.state.config
        info = engine.model_info
        ids = render_chat(engine.tokenizer, [*system, *conversation], True, trace,
                          tools.tools if tools else None)
        limit = fit_context(len(ids), req.max_output_tokens, info.max_model_len,
                            "max_output_tokens", "input",
                            self.state.generation_defaults.get("max_tokens"))
        try:
            params = sampling_params(_as_common(req), limit, None, info, cfg,
                                     self.state.generation_defaults)
        except ParamError as e:
            raise ParamError(str(e), param=text_format_param(e.param)) from None
        if tools is not None and tools.spec is not None:
            validate(tools.spec, "tools")
            params.structured_outputs = tools.spec
        return ResponsesPrepared([Job(ids, params)], 1, bool(req.stream), False, None, tools=tools,
                                 req=req, conversation=conversation)

    async def get(self, request: Request) -> Response:
        return json_response(self.store.get(request.path_params["response_id"]).response)

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        prep = _prep(ctx)
        choice = ctx.choice(index)
        delta = out.outputs[0]
        events = []
        if prep.items is None:
            prep.items = OutputItems(prep.tools)
            pending = self._response(ctx, "in_progress", [])
            events += [{"type": "response.created", "response": pending},
                       {"type": "response.in_progress", "response": pending}, *prep.items.start()]
        choice.num_tokens += len(delta.token_ids)
        events += prep.items.feed(delta.text, out.finished)
        if out.finished:
            choice.finish_reason = finish_reason(out)
            events.append(self._finish(ctx, prep.items))
        return events

    def _finish(self, ctx: Ctx, items: OutputItems) -> dict:
        prep = _prep(ctx)
        incomplete = ctx.choice(0).finish_reason == "length"
        prep.final = self._response(ctx, "incomplete" if incomplete else "completed", items.items)
        if prep.req is not None and prep.req.store is not False and self.store.capacity > 0:
            answer: dict[str, Any] = {"role": "assistant", "content": items.text()}
            if calls := items.tool_calls():
                answer = {**answer, "content": answer["content"] or None, "tool_calls": calls}
            self.store.put(ctx.id, Stored(prep.final, [*prep.conversation, answer]))
        return {"type": "response.incomplete" if incomplete else "response.completed",
                "response": prep.final}

    def _response(self, ctx: Ctx, status: str, output: list[dict]) -> dict:
        req = _prep(ctx).req
        assert req is not None
        usage = ctx.usage()
        return {
            "id": ctx.id, "object": "response", "created_at": ctx.created, "status": status,
            "model": ctx.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "store": req.store is not False,
            "text": {"format": _format_echo(req)}, "tools": _tools_echo(req),
            "tool_choice": _choice_echo(req),
            "metadata": req.metadata or {}, "user": req.user,
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "input_tokens_details": usage["prompt_tokens_details"],
                      "output_tokens": usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["total_tokens"]},
        }

    def full_response(self, ctx: Ctx) -> dict:
        final = _prep(ctx).final
        assert final is not None
        return final

    async def _events(self, ctx: Ctx, item: tuple[int, RequestOutput] | None,
                      fan: FanOut) -> AsyncIterator[Any]:
        seq = itertools.count()
        try:
            while item is not None:
                ctx.observe(*item)
                for event in self.on_output(ctx, *item):
                    yield _sse(event, next(seq))
                item = await fan.next()
        except Exception as exc:  # after the headers went out, errors travel as an event
            err = to_api_error(exc).body()["error"]
            yield _sse({"type": "error", "code": err["code"], "message": err["message"],
                        "param": err["param"]}, next(seq))
        finally:
            fan.close()


def _sse(event: dict, seq: int) -> dict:
    return {"event": event["type"], "data": encode({**event, "sequence_number": seq})}


def _prep(ctx: Ctx) -> ResponsesPrepared:
    assert isinstance(ctx.prepared, ResponsesPrepared)
    return ctx.prepared


def _format_echo(req: ResponsesRequest) -> dict:
    fmt = req.text.format if req.text is not None else None
    return {"type": "text"} if fmt is None else msgspec.to_builtins(fmt)


def _tools_echo(req: ResponsesRequest) -> list[dict]:
    return [msgspec.to_builtins(t) for t in req.tools or []]


def _choice_echo(req: ResponsesRequest) -> Any:
    if req.tool_choice is None:
        return "auto" if req.tools else "none"
    return msgspec.to_builtins(req.tool_choice)


def _as_common(req: ResponsesRequest) -> CompletionRequest:
    """The fields sampling_params reads, from a Responses request (the rest: defaults)."""
    return CompletionRequest(prompt="-", temperature=req.temperature, top_p=req.top_p,
                             response_format=response_format(req))
