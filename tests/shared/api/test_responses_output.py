"""OutputItems: how streamed text becomes /v1/responses output items and events (no server)."""
from __future__ import annotations

from shared.api.responses_output import OutputItems
from shared.api.tools import ToolPlan

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def _run(items: OutputItems, pieces: list[str]) -> list[dict]:
    events = items.start()
    for i, piece in enumerate(pieces):
        events += items.feed(piece, i == len(pieces) - 1)
    return events


def test_without_tools_one_message_opens_at_once() -> None:
    items = OutputItems(None)
    assert [e["type"] for e in items.start()] == ["response.output_item.added",
                                                  "response.content_part.added"]
    events = items.feed(" Hi", False) + items.feed(" there", True)
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [" Hi", " there"]
    assert items.text() == " Hi there" and items.tool_calls() == []
    assert [i["type"] for i in items.items] == ["message"]
    assert events[-1]["type"] == "response.output_item.done"
    assert events[-1]["item"]["status"] == "completed"


def test_text_then_a_call_closes_the_message_before_the_call_opens() -> None:
    items = OutputItems(ToolPlan("auto", []))
    pieces = ["Sure.", " ", CALL[:15], CALL[15:40], CALL[40:]]
    events = _run(items, pieces)
    kinds = [e["type"] for e in events]
    msg_done = kinds.index("response.content_part.done")
    call_added = [i for i, e in enumerate(events) if e["type"] == "response.output_item.added"
                  and e["item"]["type"] == "function_call"]
    assert call_added and msg_done < call_added[0]
    assert [i["type"] for i in items.items] == ["message", "function_call"]
    assert items.text() == "Sure."      # the space before the call is held back, never shown
    call = items.items[1]
    assert call["name"] == "add" and call["arguments"] == '{"a": 1, "b": 2}'
    assert call["call_id"].startswith("call_") and call["status"] == "completed"
    assert items.tool_calls() == [{"id": call["call_id"], "type": "function",
                                   "function": {"name": "add", "arguments": call["arguments"]}}]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == call["arguments"]
    assert kinds[-2:] == ["response.function_call_arguments.done", "response.output_item.done"]


def test_whitespace_before_a_call_opens_no_message() -> None:
    items = OutputItems(ToolPlan("auto", []))
    _run(items, ["\n", "  ", CALL])
    assert [i["type"] for i in items.items] == ["function_call"]
    assert items.text() == ""


def test_a_malformed_call_stays_text() -> None:
    items = OutputItems(ToolPlan("auto", []))
    _run(items, ["<tool_call>\nnot json\n</tool_call>"])
    assert [i["type"] for i in items.items] == ["message"]
    assert "not json" in items.text()
