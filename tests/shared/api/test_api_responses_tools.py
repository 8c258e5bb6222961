"""Function tools on /v1/responses, both engines, with the official openai client.

tool_choice "required" and a named tool go through chat's call grammar, so even SmolLM2-135M
answers with function_call items whose arguments validate against the tool's parameters.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.shared.api.api_helpers import model_id, sse_data
from tests.shared.api.test_api_tools import ADD, WEATHER

pytestmark = pytest.mark.slow

RESPONSES = "/v1/responses"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": WEATHER},
         {"type": "function", "name": "add", "description": "Add two integers", "parameters": ADD}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = "What is the weather in Paris, and what is 2 + 3?"


def _calls(output: list) -> list:
    calls = [item for item in output if item.type == "function_call"]
    for c in calls:
        assert c.call_id.startswith("call_") and c.id.startswith("fc_") and c.status == "completed"
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    return calls


def test_required_answers_with_function_call_items(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=model_id(oai), input=ASK, tools=TOOLS, tool_choice="required",
                             parallel_tool_calls=False, max_output_tokens=120, temperature=1.0)
    assert r.status == "completed"
    assert _calls(r.output)
    assert r.tool_choice == "required" and [t.name for t in r.tools] == ["get_weather", "add"]


def test_a_named_tool_without_parallel_calls_is_one_call(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=model_id(oai), input=ASK, tools=TOOLS, max_output_tokens=60,
                             tool_choice={"type": "function", "name": "add"})
    calls = _calls(r.output)
    assert [c.name for c in calls] == ["add"]
    assert all(item.type == "function_call" for item in r.output)   # no empty message item


def test_the_stream_matches_its_final_response(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=model_id(oai), input=ASK, tools=TOOLS, tool_choice="required",
                              parallel_tool_calls=False, max_output_tokens=120,
                              temperature=1.0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    args: dict[int, str] = {}
    opened: list[int] = []
    for e in events:
        if e.type == "response.output_item.added" and e.item.type == "function_call":
            assert e.item.arguments == "" and e.output_index not in opened
            opened.append(e.output_index)
        elif e.type == "response.function_call_arguments.delta":
            args[e.output_index] = args.get(e.output_index, "") + e.delta
        elif e.type == "response.function_call_arguments.done":
            assert e.arguments == args[e.output_index]
    calls = _calls(final.output)
    assert [args[i] for i in opened] == [c.arguments for c in calls]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"


def test_function_call_output_round_trip(oai: openai.OpenAI) -> None:
    model = model_id(oai)
    first = oai.responses.create(model=model, input=ASK, tools=TOOLS, max_output_tokens=60,
                                 tool_choice={"type": "function", "name": "add"})
    call = _calls(first.output)[0]
    items = [{"role": "user", "content": ASK},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    second = oai.responses.create(model=model, input=items, tools=TOOLS, tool_choice="none",
                                  max_output_tokens=8, temperature=0)
    assert [item.type for item in second.output] == ["message"]
    alone = oai.responses.create(model=model, input=ASK, tools=TOOLS, tool_choice="none",
                                 max_output_tokens=1)
    # The call and its result reached the prompt: more input than the question alone.
    assert second.usage.input_tokens > alone.usage.input_tokens + 10
    # previous_response_id carries the stored call: only its output needs sending.
    third = oai.responses.create(model=model, previous_response_id=first.id, tools=TOOLS,
                                 input=[items[2]], tool_choice="none", max_output_tokens=8,
                                 temperature=0)
    assert third.usage.input_tokens == second.usage.input_tokens


def test_raw_stream_events_of_a_call(client) -> None:
    body = {"input": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "name": "add"},
            "max_output_tokens": 60, "stream": True}
    with client.stream("POST", RESPONSES, json=body) as resp:
        assert resp.status_code == 200
        events = sse_data(list(resp.iter_lines()))
    kinds = [e["type"] for e in events if isinstance(e, dict)]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert "response.output_text.delta" not in kinds and "[DONE]" not in events
