"""/v1/responses input -> chat messages and response_format, the bounded response store,
and the features that wait for tool calling on this endpoint."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from shared.api.errors import APIError
from shared.api.protocol import ResponseInputItem, ResponsesRequest
from shared.api.protocol_tools import JsonSchemaFormat, ResponseFormat
from shared.errors import ParamError


def check_unsupported(req: ResponsesRequest) -> None:
    """ISSUE-13 HOOK: tools, tool_choice and function-call items are refused here until the
    Responses API maps them onto chat tool calling (text.format is: see ``response_format``)."""
    if req.tools:
        raise ParamError("tools are not supported on /v1/responses yet; use /v1/chat/completions",
                         param="tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise ParamError("tool_choice needs tools, which /v1/responses does not support yet",
                         param="tool_choice")
    if isinstance(req.input, list):
        for i, item in enumerate(req.input):
            if item.type != "message":
                raise ParamError(f"{item.type} items need tool calling, which /v1/responses "
                                 f"does not support yet", param=f"input[{i}]")


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
    OpenAI does not carry them over to a follow-up response)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    return [_message(item, i) for i, item in enumerate(req.input)]


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
