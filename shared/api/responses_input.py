"""/v1/responses input -> chat messages, tools and response_format; the bounded response store."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from shared.api.errors import APIError
from shared.api.protocol import ResponseInputItem, ResponsesRequest
from shared.api.protocol_tools import JsonSchemaFormat, ResponseFormat, ResponsesNamedToolChoice
from shared.api.tools import ToolPlan, plan
from shared.errors import ParamError


def plan_tools(req: ResponsesRequest) -> ToolPlan | None:
    """tools and tool_choice through chat's tool calling (flat function tools mapped to chat's)."""
    fmt = req.text.format if req.text is not None else None
    constrained = fmt is not None and fmt.type != "text"
    tools = [t.as_chat() for t in req.tools] if req.tools else None
    choice = req.tool_choice
    named = choice.name if isinstance(choice, ResponsesNamedToolChoice) else None
    return plan(tools, choice if named is None else "named", named, req.parallel_tool_calls,
                constrained, lambda i: f"tools[{i}].parameters")


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """text.format as chat's response_format (structured outputs validate and enforce it)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None:
        return None
    schema = None
    if fmt.type == "json_schema":
        if not fmt.name:
            raise ParamError("text.format of type json_schema needs a name", param="text.format.name")
        schema = JsonSchemaFormat(name=fmt.name, schema=fmt.schema, strict=fmt.strict)
    return ResponseFormat(type=fmt.type, json_schema=schema)


def text_format_param(param: str | None) -> str | None:
    """A response_format error's param, named as the Responses request spells it."""
    if param is None or not param.startswith("response_format"):
        return param
    rest = param[len("response_format"):].replace(".json_schema", "", 1)
    return "text.format" + rest


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own input as chat-template messages (instructions are added apart:
    OpenAI does not carry them over to a follow-up response). function_call items join the
    assistant message before them as tool_calls; function_call_output items are tool messages."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        if item.type == "function_call":
            _add_call(messages, item, i)
        elif item.type == "function_call_output":
            if item.call_id is None or item.output is None:
                raise ParamError("a function_call_output item needs call_id and output",
                                 param=f"input[{i}]")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            messages.append(_message(item, i))
    return messages


def _add_call(messages: list[dict[str, Any]], item: ResponseInputItem, index: int) -> None:
    if item.call_id is None or item.name is None or item.arguments is None:
        raise ParamError("a function_call item needs call_id, name and arguments",
                         param=f"input[{index}]")
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _message(item: ResponseInputItem, index: int) -> dict[str, Any]:
    if item.role is None or item.content is None:
        raise ParamError("a message item needs role and content", param=f"input[{index}]")
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    return {"role": item.role, "content": "".join(part.text for part in item.content)}


@dataclass
class Stored:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]      # input messages plus the assistant's answer


class ResponseStore:
    """The last ``capacity`` stored responses, oldest evicted first (in memory, per process)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response_id: str, stored: Stored) -> None:
        if self.capacity <= 0:
            return
        self._items[response_id] = stored
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> Stored:
        stored = self._items.get(response_id)
        if stored is None:
            raise APIError(404, f"Response with id {response_id!r} not found (the server keeps "
                                f"the last {self.capacity} stored responses in memory).",
                           param=param, code="response_not_found")
        return stored

    def check_store(self, store: bool | None) -> None:
        if store and self.capacity <= 0:
            raise ParamError("store is disabled on this server (--responses-store-size 0); "
                             "send store: false", param="store")
