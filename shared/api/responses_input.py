"""/v1/responses input -> chat messages, the bounded response store, and the features
that wait for structured outputs and tool calling (issue 13)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from shared.api.errors import APIError
from shared.api.protocol import ResponseInputItem, ResponsesRequest
from shared.errors import ParamError


def check_unsupported(req: ResponsesRequest) -> None:
    """ISSUE-13 HOOK: json_schema/json_object formats, tools, tool_choice and function-call
    items are refused here until structured outputs and tool calling exist; wire them to
    that machinery in this one place."""
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        raise ParamError(f"text.format type {fmt.type!r} is not supported yet; use 'text'",
                         param="text.format")
    if req.tools:
        raise ParamError("tools are not supported yet", param="tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise ParamError("tool_choice needs tools, which are not supported yet",
                         param="tool_choice")
    if isinstance(req.input, list):
        for i, item in enumerate(req.input):
            if item.type != "message":
                raise ParamError(f"{item.type} items need tool calling, which is not "
                                 f"supported yet", param=f"input[{i}]")


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
