"""POST /v1/responses and GET /v1/responses/{id}, with the official openai client, both engines."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.shared.api.api_helpers import assert_error, model_id, sse_data, wait_engine_idle

RESPONSES = "/v1/responses"
MSG = [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}]


def test_create_string_input(oai):
    r = oai.responses.create(model=model_id(oai), input="Say hello.", instructions="Be brief.",
                             max_output_tokens=200, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text" and r.output_text
    assert r.instructions == "Be brief." and r.incomplete_details is None
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens > 0
    assert u.input_tokens_details.cached_tokens == 0 or u.input_tokens_details.cached_tokens % 16 == 0


def test_max_output_tokens_is_incomplete(oai):
    r = oai.responses.create(model=model_id(oai), input=MSG, max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_stream_matches_create(oai):
    model = model_id(oai)
    full = oai.responses.create(model=model, input=MSG, max_output_tokens=200, temperature=0)
    with oai.responses.stream(model=model, input=MSG, max_output_tokens=200, temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == full.output_text   # greedy: stream and create agree
    assert final.usage.output_tokens == full.usage.output_tokens


def test_raw_stream_has_event_lines_and_no_done(server):
    with server.client() as c, c.stream("POST", RESPONSES, json={
            "input": "Hi", "max_output_tokens": 2, "stream": True}) as resp:
        lines = list(resp.iter_lines())
    events = [ln.removeprefix("event:").strip() for ln in lines if ln.startswith("event:")]
    data = sse_data(lines)
    assert "[DONE]" not in data and events == [d["type"] for d in data]
    assert events[-1] == "response.incomplete"


def test_store_retrieve_and_previous_response_id(oai):
    model = model_id(oai)
    first = oai.responses.create(model=model, input="My name is Ada.", max_output_tokens=8)
    got = oai.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    follow = oai.responses.create(model=model, input="What is my name?", max_output_tokens=4,
                                  previous_response_id=first.id)
    alone = oai.responses.create(model=model, input="What is my name?", max_output_tokens=4)
    # The follow-up's prompt holds the first exchange too.
    assert follow.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert follow.previous_response_id == first.id


def test_store_false_is_not_kept(oai, client):
    r = oai.responses.create(model=model_id(oai), input="Hi", max_output_tokens=2, store=False)
    assert_error(client.get(f"{RESPONSES}/{r.id}"), 404, "response_id")


def test_text_format_json_schema_is_enforced(oai):
    schema = {"type": "object", "required": ["city", "rank"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "maxLength": 20},
                             "rank": {"type": "integer", "minimum": 1, "maximum": 10}}}
    r = oai.responses.create(model=model_id(oai), input="Name a city.", max_output_tokens=60,
                             text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                              "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_unknown_ids_are_404(client):
    assert_error(client.get(f"{RESPONSES}/resp_missing"), 404, "response_id")
    assert_error(client.post(RESPONSES, json={"input": "Hi", "previous_response_id": "resp_x"}),
                 404, "previous_response_id")


@pytest.mark.parametrize("body, param", [
    ({"input": "Hi", "tools": [{"type": "function", "name": "f",
                                "parameters": {"type": "objectx"}}]}, "tools[0].parameters"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]},
     "tools"),
    ({"input": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
    ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"type": "objectx"}}}}, "text.format.schema"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]"),
    ({"input": [{"role": "user"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ({"input": "Hi", "temperature": 2.5}, "temperature"),
])
def test_bad_requests(client, body, param):
    assert_error(client.post(RESPONSES, json=body), 400, param)
    wait_engine_idle(client)


def test_openapi_has_responses(client):
    doc = client.get("/openapi.json").json()
    assert "/v1/responses" in doc["paths"] and "/v1/responses/{response_id}" in doc["paths"]
    props = doc["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert {"input", "instructions", "max_output_tokens", "store", "previous_response_id",
            "tools", "tool_choice", "parallel_tool_calls"} <= set(props)
    tool = doc["components"]["schemas"]["ResponsesFunctionTool"]
    assert {"type", "name", "parameters"} <= set(tool["properties"]) and "name" in tool["required"]
    assert json.dumps(doc["components"]["schemas"]["Response"])
