"""Structured outputs on a real server, both engines, through the official openai client.

SmolLM2-135M is far too weak to produce valid JSON on its own: every check that the output
parses and validates holds only because the grammar constrains decoding.
"""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, assert_error, stream_events

pytestmark = pytest.mark.slow

PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                 "minItems": 2, "maxItems": 3},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                    "properties": {"city": {"type": "string", "maxLength": 16},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    },
    "required": ["name", "age", "score", "role", "tags", "address"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give me a user profile as JSON."}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "profile", "schema": schema, "strict": True}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates(oai: openai.OpenAI, served_model: str, temperature: float) -> None:
    resp = oai.chat.completions.create(model=served_model, messages=ASK, max_tokens=200, seed=7,
                                       temperature=temperature, response_format=_schema_format(PROFILE))
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PROFILE)


def test_streamed_json_equals_the_non_streamed_one(client, served_model: str) -> None:
    body = {"model": served_model, "messages": ASK, "max_tokens": 200, "temperature": 0.8, "seed": 3,
            "response_format": _schema_format(PROFILE)}
    full = client.post(CHAT, json=body).json()["choices"][0]
    events = [e for e in stream_events(client, CHAT, body) if isinstance(e, dict)]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == full["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), PROFILE)


def test_parse_with_a_pydantic_model(oai: openai.OpenAI, served_model: str) -> None:
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        population: int = pydantic.Field(ge=0, le=10**8)
        capital: bool

    resp = oai.beta.chat.completions.parse(
        model=served_model, max_tokens=100, response_format=City,
        messages=[{"role": "user", "content": "Describe Paris."}])
    city = resp.choices[0].message.parsed
    assert isinstance(city, City) and 0 <= city.population <= 10**8


def test_json_object_is_an_object(oai: openai.OpenAI, served_model: str) -> None:
    resp = oai.chat.completions.create(model=served_model, messages=ASK, max_tokens=150,
                                       response_format={"type": "json_object"})
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(resp.choices[0].message.content), dict)
    else:   # a free-form object may run to max_tokens; what came out is still its start
        assert resp.choices[0].message.content.startswith("{")


def test_regex_choice_and_grammar(client, served_model: str) -> None:
    cases = [({"regex": r"[0-9]{3}-[a-z]{2,4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t)),
             ({"choice": ["yes", "no, never", "maybe \"so\""]},
              lambda t: t in ("yes", "no, never", "maybe \"so\"")),
             ({"grammar": 'root ::= "x" [0-9] [0-9]? "!"'}, lambda t: re.fullmatch(r"x[0-9]{1,2}!", t))]
    for spec, ok in cases:
        for path, body in ((CHAT, {"messages": ASK}), (COMPLETIONS, {"prompt": "Answer:"})):
            resp = client.post(path, json={"model": served_model, "max_tokens": 30, "temperature": 1.0,
                                           "structured_outputs": spec, **body})
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"] if path == CHAT else choice["text"]
            assert ok(text), (spec, text)
            assert choice["finish_reason"] == "stop"


def test_max_tokens_cuts_the_json_with_length(client, served_model: str) -> None:
    resp = client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 5,
                                   "response_format": _schema_format(PROFILE)})
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert resp.json()["usage"]["completion_tokens"] == 5
    assert choice["message"]["content"].startswith('{"name": "')


def test_n_choices_each_follow_the_grammar(client, served_model: str) -> None:
    resp = client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 200, "n": 3,
                                   "temperature": 1.0, "response_format": _schema_format(PROFILE)})
    for choice in resp.json()["choices"]:
        jsonschema.validate(json.loads(choice["message"]["content"]), PROFILE)


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": _schema_format({"type": "objectx"})}, "response_format.json_schema.schema"),
    ({"response_format": _schema_format({"$ref": "http://example.com/s.json"})},
     "response_format.json_schema.schema"),
    ({"response_format": _schema_format({"type": "array", "minItems": 3, "maxItems": 1})},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": 'root ::= "yes'}}, "structured_outputs"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
])
def test_bad_specs_are_400s_and_the_server_keeps_serving(client, served_model: str, body: dict,
                                                         param: str) -> None:
    resp = client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 5, **body})
    assert_error(resp, 400, param)
    ok = client.post(CHAT, json={"model": served_model, "messages": ASK, "max_tokens": 2})
    assert ok.status_code == 200
