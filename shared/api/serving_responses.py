"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over chat generation.

One message output item with one output_text part per response. Streaming sends OpenAI's
typed events (``event:`` line and ``type`` field, a ``sequence_number`` on each) and no
[DONE]. Stored responses live in a bounded in-memory store (responses_input.py).
"""
from __future__ import annotations

import itertools
import uuid
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
    check_unsupported,
    input_messages,
    response_format,
    text_format_param,
)
from shared.api.serving import Ctx, Serving, encode, finish_reason, json_response
from shared.api.state import AppState
from shared.errors import ParamError
from shared.frontend.outputs import RequestOutput
from shared.trace.tracer import TraceHandle


@dataclass
class ResponsesPrepared(Prepared):
    req: ResponsesRequest | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
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
        check_unsupported(req)
        self.store.check_store(req.store)
        history = []
        if req.previous_response_id is not None:
            history = self.store.get(req.previous_response_id, "previous_response_id").conversation
        conversation = [*history, *input_messages(req)]
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        engine, cfg = self.state.engine, self.state.config
        info = engine.model_info
        ids = render_chat(engine.tokenizer, [*system, *conversation], True, trace)
        limit = fit_context(len(ids), req.max_output_tokens, info.max_model_len,
                            "max_output_tokens", "input",
                            self.state.generation_defaults.get("max_tokens"))
        try:
            params = sampling_params(_as_common(req), limit, None, info, cfg,
                                     self.state.generation_defaults)
        except ParamError as e:
            raise ParamError(str(e), param=text_format_param(e.param)) from None
        return ResponsesPrepared([Job(ids, params)], 1, bool(req.stream), False, None,
                                 req=req, conversation=conversation)

    async def get(self, request: Request) -> Response:
        return json_response(self.store.get(request.path_params["response_id"]).response)

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        prep = _prep(ctx)
        choice = ctx.choice(index)
        delta = out.outputs[0]
        events = []
        if not choice.started:
            choice.started = True
            events += self._opening(ctx)
        choice.text.append(delta.text)
        choice.num_tokens += len(delta.token_ids)
        if delta.text:
            events.append({"type": "response.output_text.delta", "item_id": prep.item_id,
                           "output_index": 0, "content_index": 0, "delta": delta.text,
                           "logprobs": []})
        if out.finished:
            choice.finish_reason = finish_reason(out)
            events += self._closing(ctx)
        return events

    def _opening(self, ctx: Ctx) -> list[dict]:
        item = {**_message_item(_prep(ctx).item_id, ""), "status": "in_progress", "content": []}
        pending = self._response(ctx, "in_progress", [])
        return [{"type": "response.created", "response": pending},
                {"type": "response.in_progress", "response": pending},
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.content_part.added", "item_id": item["id"], "output_index": 0,
                 "content_index": 0, "part": _text_part("")}]

    def _closing(self, ctx: Ctx) -> list[dict]:
        prep = _prep(ctx)
        text = "".join(ctx.choice(0).text)
        item = _message_item(prep.item_id, text)
        incomplete = ctx.choice(0).finish_reason == "length"
        prep.final = self._response(ctx, "incomplete" if incomplete else "completed", [item])
        if prep.req is not None and prep.req.store is not False and self.store.capacity > 0:
            answer = {"role": "assistant", "content": text}
            self.store.put(ctx.id, Stored(prep.final, [*prep.conversation, answer]))
        ids = {"item_id": prep.item_id, "output_index": 0, "content_index": 0}
        return [{"type": "response.output_text.done", **ids, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **ids, "part": _text_part(text)},
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.incomplete" if incomplete else "response.completed",
                 "response": prep.final}]

    def _response(self, ctx: Ctx, status: str, output: list[dict]) -> dict:
        req = _prep(ctx).req
        assert req is not None
        usage = ctx.usage()
        return {
            "id": ctx.id, "object": "response", "created_at": ctx.created, "status": status,
            "model": ctx.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": False,
            "previous_response_id": req.previous_response_id, "store": req.store is not False,
            "text": {"format": _format_echo(req)}, "tool_choice": "none", "tools": [],
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


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
            "content": [_text_part(text)]}


def _as_common(req: ResponsesRequest) -> CompletionRequest:
    """The fields sampling_params reads, from a Responses request (the rest: defaults)."""
    return CompletionRequest(prompt="-", temperature=req.temperature, top_p=req.top_p,
                             response_format=response_format(req))
