"""The output items of one /v1/responses answer as they stream: message text and function calls.

Without tools the answer is one message item, opened at once. With tools the model's text is
parsed (shared/frontend/tool_parser.py) and each Hermes call becomes a ``function_call`` item;
text opens a message item only once it is more than whitespace. Each item is closed (its
``.done`` events sent) before the next one opens, as OpenAI streams them.
"""
from __future__ import annotations

import uuid
from typing import Any

from shared.api.tools import ToolPlan, new_call_id
from shared.frontend.tool_parser import ArgsDelta, CallStart, Content, Event, HermesToolParser


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputItems:
    def __init__(self, tools: ToolPlan | None) -> None:
        self.parser: HermesToolParser | None = tools.parser() if tools is not None else None
        self.items: list[dict[str, Any]] = []   # every item so far, in output order
        self._open: dict[str, Any] | None = None
        self._held = ""                 # whitespace not yet shown (it may precede a call)

    def start(self) -> list[dict]:
        """Events before the first delta: without tools, the message item opens now."""
        return self._open_message() if self.parser is None else []

    def feed(self, text: str, finished: bool) -> list[dict]:
        """Events for a delta of generated text; on ``finished`` every open item closes."""
        if self.parser is None:
            events: list[Event] = [Content(text)] if text else []
        else:
            events = self.parser.feed(text) + (self.parser.finish() if finished else [])
        out = [e for ev in events for e in self._on(ev)]
        if finished:
            out += self._close()
        return out

    def text(self) -> str:
        return "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls as chat's assistant tool_calls (for the stored conversation)."""
        return [{"id": i["call_id"], "type": "function",
                 "function": {"name": i["name"], "arguments": i["arguments"]}}
                for i in self.items if i["type"] == "function_call"]

    def _on(self, ev: Event) -> list[dict]:
        if isinstance(ev, CallStart):
            item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress",
                    "call_id": new_call_id(), "name": ev.name, "arguments": ""}
            events = self._close()
            self._open = item
            self.items.append(item)
            return [*events, {"type": "response.output_item.added", "output_index": self._index(),
                              "item": dict(item)}]
        if isinstance(ev, ArgsDelta):
            assert self._open is not None and self._open["type"] == "function_call"
            self._open["arguments"] += ev.text
            return [{"type": "response.function_call_arguments.delta", "item_id": self._open["id"],
                     "output_index": self._index(), "delta": ev.text}]
        assert isinstance(ev, Content)
        return self._text(ev.text)

    def _text(self, text: str) -> list[dict]:
        if self._open is None or self._open["type"] != "message":
            if not (self._held + text).strip():
                self._held += text
                return []
            text, self._held = self._held + text, ""
            events = self._close() + self._open_message()
        else:
            events = []
        assert self._open is not None
        self._open["content"][0]["text"] += text
        return [*events, {"type": "response.output_text.delta", "item_id": self._open["id"],
                          "output_index": self._index(), "content_index": 0, "delta": text,
                          "logprobs": []}]

    def _open_message(self) -> list[dict]:
        item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress",
                "role": "assistant", "content": [text_part("")]}
        self._open = item
        self.items.append(item)
        shown = {**item, "content": []}
        return [{"type": "response.output_item.added", "output_index": self._index(), "item": shown},
                {"type": "response.content_part.added", "item_id": item["id"],
                 "output_index": self._index(), "content_index": 0, "part": text_part("")}]

    def _close(self) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = "completed"
        index = self.items.index(item)
        done = {"type": "response.output_item.done", "output_index": index, "item": item}
        if item["type"] == "function_call":
            return [{"type": "response.function_call_arguments.done", "item_id": item["id"],
                     "output_index": index, "name": item["name"], "arguments": item["arguments"]},
                    done]
        text = item["content"][0]["text"]
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [{"type": "response.output_text.done", **ids, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **ids, "part": text_part(text)}, done]

    def _index(self) -> int:
        return len(self.items) - 1
