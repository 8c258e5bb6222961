"""/openapi.json is generated from protocol.py's Structs: every field they accept is in it, and
every numeric bound it states is the one decoding (or requests.py, for config limits) enforces."""
from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import msgspec

from shared.api import build_app
from shared.api.protocol import REQUEST_TYPES, ChatCompletionRequest, CompletionRequest
from shared.config import ServerConfig
from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO
from tests.shared.api.fake_engine import FakeEngine

_PREFIX = "#/components/schemas/"
# Base bodies that succeed; each bound test changes one field of them.
_BASE = {"ChatCompletionRequest": (CHAT, {"messages": HELLO, "max_tokens": 2}),
         "CompletionRequest": (COMPLETIONS, {"prompt": "ab", "max_tokens": 2}),
         "ResponsesRequest": ("/v1/responses", {"input": "ab", "max_output_tokens": 2})}
_NEEDS = {"top_logprobs": {"logprobs": True}}   # a rule across fields, not a bound


def _run(fn: Callable[[httpx.AsyncClient], Awaitable[Any]], **cfg: Any) -> Any:
    app = build_app(FakeEngine(), ServerConfig(engine="v0", **cfg))

    async def main() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as c:
            return await fn(c)
    return asyncio.run(main())


def _served_schemas(**cfg: Any) -> dict[str, Any]:
    async def fn(c: httpx.AsyncClient) -> Any:
        return (await c.get("/openapi.json")).json()
    return _run(fn, **cfg)["components"]["schemas"]


def _nested_structs(tp: Any) -> Iterator[type[msgspec.Struct]]:
    """Struct types anywhere inside a field's type (unions, lists, Annotated)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        yield tp
        return
    for arg in typing.get_args(tp):
        yield from _nested_structs(arg)


def _accepts_null(prop: dict[str, Any]) -> bool:
    return {"type": "null"} in prop.get("anyOf", [])


def test_every_struct_field_is_in_the_served_schema():
    schemas = _served_schemas()
    todo, seen = list(REQUEST_TYPES), set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        schema = schemas[cls.__name__]
        for field in msgspec.structs.fields(cls):
            prop = schema["properties"].get(field.encode_name)
            assert prop is not None, f"{cls.__name__}.{field.encode_name} missing from /openapi.json"
            assert (field.encode_name in schema.get("required", [])) == field.required, field
            if field.default is None:   # null must keep meaning "default"
                assert _accepts_null(prop), f"{cls.__name__}.{field.encode_name} rejects null"
            for nested in _nested_structs(field.type):
                assert f'"{_PREFIX}{nested.__name__}"' in json.dumps(prop), (field, nested)
                todo.append(nested)
    assert {"ChatMessage", "ContentPart", "StreamOptions"} <= {c.__name__ for c in seen}


def test_request_bodies_are_the_request_structs():
    async def fn(c: httpx.AsyncClient) -> Any:
        return (await c.get("/openapi.json")).json()
    doc = _run(fn)
    bodies = {op["requestBody"]["content"]["application/json"]["schema"]["$ref"].removeprefix(_PREFIX)
              for item in doc["paths"].values() for op in item.values() if "requestBody" in op}
    assert bodies == {cls.__name__ for cls in REQUEST_TYPES}


def _numeric_bounds(schemas: dict[str, Any]) -> Iterator[tuple[str, str, str, float, float]]:
    """(request, field, keyword, outside, inside) for each bound of a top-level number field."""
    for request in _BASE:
        for field, prop in schemas[request]["properties"].items():
            for branch in prop.get("anyOf", [prop]):
                kind = branch.get("type")
                if kind not in ("integer", "number"):
                    continue
                step = 1 if kind == "integer" else 1e-6
                for keyword, value in branch.items():
                    if keyword in ("minimum", "maximum", "exclusiveMinimum"):
                        out, ins = {"minimum": (value - step, value), "maximum": (value + step, value),
                                    "exclusiveMinimum": (value, value + step)}[keyword]
                        yield request, field, keyword, out, ins


def test_a_value_just_outside_each_bound_is_a_400_and_just_inside_is_not():
    schemas = _served_schemas()
    cases = list(_numeric_bounds(schemas))

    async def fn(c: httpx.AsyncClient) -> list[tuple[Any, httpx.Response, httpx.Response]]:
        out = []
        for case in cases:
            request, field, _, outside, inside = case
            path, base = _BASE[request]
            body = {**base, **_NEEDS.get(field, {})}
            out.append((case, await c.post(path, json={**body, field: outside}),
                        await c.post(path, json={**body, field: inside})))
        return out
    for case, bad, good in _run(fn):
        assert bad.status_code == 400 and bad.json()["error"]["param"] == case[1], (case, bad.text)
        if good.status_code != 200:  # max_tokens = max_model_len leaves no room for the prompt
            assert good.json()["error"]["code"] == "context_length_exceeded", (case, good.text)
    covered = {(request, field, keyword) for request, field, keyword, *_ in cases}
    for field, keyword in [("temperature", "minimum"), ("top_p", "exclusiveMinimum"),
                           ("top_p", "maximum"), ("n", "minimum"), ("n", "maximum"),
                           ("presence_penalty", "minimum"), ("presence_penalty", "maximum"),
                           ("top_logprobs", "minimum"), ("top_logprobs", "maximum"),
                           ("seed", "maximum"), ("max_tokens", "maximum")]:
        assert ("ChatCompletionRequest", field, keyword) in covered, (field, keyword)
    assert ("CompletionRequest", "logprobs", "maximum") in covered


def test_config_limits_are_served_and_enforced():
    """The served schema states the bounds that come from ServerConfig and ModelInfo."""
    limits = {"max_n": 3, "max_stop_strings": 2}
    schemas = _served_schemas(**limits)
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["n"]["anyOf"][0]["maximum"] == 3
    stop_list = chat["stop"]["anyOf"][1]
    assert stop_list["maxItems"] == 2
    max_id = chat["stop_token_ids"]["anyOf"][0]["items"]["maximum"]
    assert max_id == FakeEngine().model_info.vocab_size - 1
    assert "x-twinserve-limit" not in json.dumps(schemas)

    async def fn(c: httpx.AsyncClient) -> list[httpx.Response]:
        bodies = [{"n": 3}, {"n": 4}, {"stop": ["a", "b"]}, {"stop": ["a", "b", "c"]},
                  {"stop_token_ids": [max_id]}, {"stop_token_ids": [max_id + 1]}]
        return [await c.post(CHAT, json={"messages": HELLO, "max_tokens": 2, **b}) for b in bodies]
    responses = _run(fn, **limits)
    for good, bad, param in zip(responses[::2], responses[1::2], ("n", "stop", "stop_token_ids")):
        assert good.status_code == 200, good.text
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text


def test_null_is_the_default_for_every_optional_field():
    def nulls(cls: type[msgspec.Struct]) -> dict[str, None]:
        return {f.encode_name: None for f in msgspec.structs.fields(cls) if f.default is None}

    async def fn(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.post(CHAT, json={**nulls(ChatCompletionRequest), "messages": HELLO}),
                await c.post(COMPLETIONS, json={**nulls(CompletionRequest), "prompt": "ab"}),
                await c.post("/detokenize", json={"model": None, "tokens": [97]})]
    for r in _run(fn):
        assert r.status_code == 200, r.text


def test_element_bounds_name_the_list():
    """An empty stop string or a negative token id names the field, as the hand checks did."""
    async def fn(c: httpx.AsyncClient) -> list[tuple[str, httpx.Response]]:
        cases = [(CHAT, {"messages": HELLO, "stop": ["a", ""]}, "stop"),
                 (CHAT, {"messages": HELLO, "stop_token_ids": [1, -1]}, "stop_token_ids"),
                 (COMPLETIONS, {"prompt": [[1], [2, -1]]}, "prompt"),
                 (COMPLETIONS, {"prompt": ["a", ""]}, "prompt"),
                 (COMPLETIONS, {"prompt": [None]}, "prompt[0]"),     # a type error keeps its path
                 (CHAT, {"messages": [{"content": "x"}]}, "messages[0].role"),
                 ("/detokenize", {"tokens": [-1]}, "tokens")]
        return [(param, await c.post(path, json=body)) for path, body, param in cases]
    for param, r in _run(fn):
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text)
