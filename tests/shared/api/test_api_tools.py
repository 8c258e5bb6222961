"""Tool calling on a real server, both engines, with the official openai client.

"required" and a named tool_choice are enforced by the call grammar, so even SmolLM2-135M
always answers with well-formed calls whose arguments validate against the tool's schema.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.shared.api.api_helpers import CHAT, assert_error, stream_events

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}}}
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                           "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


def _check_calls(calls: list) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_always_calls_a_tool(oai: openai.OpenAI, served_model: str, parallel: bool) -> None:
    # Sampled at temperature 1, parallel calls may run to several (~35 tokens each; where the
    # sampled path goes moves with the CPU's float results): room for them to close.
    resp = oai.chat.completions.create(model=served_model, messages=ASK, tools=TOOLS,
                                       max_tokens=600 if parallel else 120,
                                       tool_choice="required", parallel_tool_calls=parallel,
                                       temperature=1.0, seed=4)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    _check_calls(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_a_named_tool_is_the_one_called(oai: openai.OpenAI, served_model: str) -> None:
    resp = oai.chat.completions.create(model=served_model, messages=ASK, tools=TOOLS, max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "add"}})
    calls = resp.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["add"]
    _check_calls(calls)


def test_the_stream_concatenates_to_the_non_streamed_calls(client, served_model: str) -> None:
    # One call, greedy: the grammar then closes the reply, so the two runs cannot part on
    # a near-tie between a second call and the end (bf16 with and without a prefix hit).
    body = {"model": served_model, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0.0}
    full = client.post(CHAT, json=body).json()["choices"][0]
    calls: dict[int, dict] = {}
    content, reasons = "", []
    for e in stream_events(client, CHAT, body):
        if not isinstance(e, dict) or not e["choices"]:
            continue
        delta = e["choices"][0]["delta"]
        content += delta.get("content") or ""
        reasons.append(e["choices"][0]["finish_reason"])
        for d in delta.get("tool_calls") or []:
            if "id" in d:       # the first delta of a call: id, type and name
                assert d["index"] not in calls and d["function"]["arguments"] == ""
                calls[d["index"]] = {"name": d["function"]["name"], "arguments": ""}
            calls[d["index"]]["arguments"] += d["function"]["arguments"]
    want = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in full["message"]["tool_calls"]]
    assert [calls[i] for i in sorted(calls)] == want
    assert content == "" and full["message"]["content"] is None
    assert reasons[-1] == full["finish_reason"] == "tool_calls"


def test_a_tool_round_trip(oai: openai.OpenAI, served_model: str) -> None:
    first = oai.chat.completions.create(model=served_model, messages=ASK, tools=TOOLS, max_tokens=60,
                                        tool_choice={"type": "function", "function": {"name": "add"}})
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = oai.chat.completions.create(model=served_model, messages=history, tools=TOOLS,
                                         max_tokens=10, tool_choice="none")
    assert second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)


def test_auto_answers_in_text_or_calls(oai: openai.OpenAI, served_model: str) -> None:
    resp = oai.chat.completions.create(model=served_model, messages=ASK, tools=TOOLS, max_tokens=20)
    msg = resp.choices[0].message
    if msg.tool_calls:
        _check_calls(msg.tool_calls)
    else:
        assert isinstance(msg.content, str) and "<tool_call>" not in msg.content


def _tools(**fn) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, **fn}}]


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": _tools(parameters={"type": "objectx"})}, "tools[0].function.parameters"),
    ({"tools": _tools(name="bad name!")}, "tools"),
    ({"tools": [*_tools(), *_tools()]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"messages": [*ASK, {"role": "tool", "content": "5"}]}, "messages[1].tool_call_id"),
])
def test_bad_tool_requests_are_400s(client, served_model: str, extra: dict, param: str) -> None:
    resp = client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 5, **extra})
    assert_error(resp, 400, param)
    assert client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([*ASK, {"role": "assistant", "content": None}], "messages[1].content"),
    ([*ASK, {"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[1].tool_calls"),
])
def test_null_content_where_openai_refuses_it_is_a_400(client, served_model: str, messages: list,
                                                       param: str) -> None:
    resp = client.post(CHAT, json={"model": served_model, "messages": messages, "max_tokens": 2})
    assert_error(resp, 400, param)
