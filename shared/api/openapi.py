"""The OpenAPI 3.1 document of the server.

The request bodies are generated from protocol.py's Structs, the one place their types and
bounds are declared, so the schema cannot drift from what decoding enforces (a schema-based
fuzzer sends values just outside the bounds and expects a 400, and values inside them and
expects no 400 for that reason). Responses, paths and the error object are written here.
"""
from __future__ import annotations

from typing import Any

import msgspec

from shared.api.protocol import LIMIT_KEY, REQUEST_TYPES
from shared.config import ServerConfig
from shared.messages import ModelInfo

_REF = "#/components/schemas/{name}"
# Rules across fields, which msgspec types cannot express; requests.py (top_logprobs) and
# server.py (tokenize) check them by hand.
_CROSS_FIELD: dict[str, dict[str, Any]] = {
    "ChatCompletionRequest": {
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
    "TokenizeRequest": {"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
}


def _opt(schema: dict[str, Any]) -> dict[str, Any]:
    """The same schema, or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def _int(lo: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo}


def _limits(cfg: ServerConfig, info: ModelInfo) -> dict[str, int]:
    """The served value of each config_max marker in protocol.py."""
    return {"max_model_len": info.max_model_len, "max_token_id": info.vocab_size - 1,
            "max_n": cfg.max_n, "max_logprobs": cfg.max_logprobs,
            "max_stop_strings": cfg.max_stop_strings}


def _fill_limits(node: Any, limits: dict[str, int]) -> None:
    """Replace every config_max marker, anywhere in the tree, by the bound it names."""
    if isinstance(node, dict):
        for keyword, name in node.pop(LIMIT_KEY, {}).items():
            node[keyword] = limits[name]
        for child in node.values():
            _fill_limits(child, limits)
    elif isinstance(node, list):
        for child in node:
            _fill_limits(child, limits)


def _split_prompt(prompt: dict[str, Any]) -> None:
    """str | list[str | id | ids] -> the four shapes OpenAI documents (requests.py rejects
    mixing, which one msgspec union cannot express)."""
    text, array = prompt["anyOf"]
    prompt["anyOf"] = [text] + [{**array, "items": item} for item in array["items"]["anyOf"]]


def request_schemas(cfg: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    """Component schemas of every request body and the Structs nested in them."""
    _, schemas = msgspec.json.schema_components(REQUEST_TYPES, ref_template=_REF)
    _fill_limits(schemas, _limits(cfg, info))
    _split_prompt(schemas["CompletionRequest"]["properties"]["prompt"])
    for name, rules in _CROSS_FIELD.items():
        schemas[name].update(rules)
    return schemas


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(name=ref)}}}


def _responses(ok: dict[str, Any], *errors: int) -> dict[str, Any]:
    out = {"200": ok}
    for code in errors:
        out[str(code)] = {"description": _ERROR_TEXT[code], "content": _json("Error")}
    return out


_ERROR_TEXT = {
    400: "Invalid request (param names the field)", 401: "Missing or wrong API key",
    404: "Unknown model", 413: "Body larger than the server's limit",
    429: "Too many requests waiting", 500: "Internal error", 503: "Engine unavailable",
}
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "string", "description": "a JSON chunk, an error object, or [DONE]"}}}
_GEN_ERRORS = (400, 401, 404, 413, 429, 500, 503)


def _components(cfg: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
             "properties": {k: _int(0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": _opt({"type": "string"}), "code": _opt({"type": "string"})}}}}
    finish = _opt({"type": "string"})
    chat_choice = {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
        "index": _int(0), "finish_reason": finish, "logprobs": _opt({"type": "object"}),
        "message": {"type": "object", "required": ["role", "content"],
                    "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}}}}
    text_choice = {"type": "object", "required": ["index", "text", "finish_reason"], "properties": {
        "index": _int(0), "text": {"type": "string"}, "finish_reason": finish,
        "logprobs": _opt({"type": "object"})}}
    return {
        **request_schemas(cfg, info), "Error": error, "Usage": usage,
        "ChatCompletion": _completion_object("chat.completion", chat_choice),
        "Completion": _completion_object("text_completion", text_choice),
        "Response": _response_object(),
    }


def _response_object() -> dict[str, Any]:
    """OpenAI's response object as serving_responses.py builds it."""
    n = _int(0)
    message = {"type": "object", "required": ["id", "type", "role", "content"],
               "properties": {"type": {"const": "message"}, "id": {"type": "string"},
                              "role": {"const": "assistant"}, "content": {"type": "array"}}}
    call = {"type": "object", "required": ["id", "type", "call_id", "name", "arguments"],
            "properties": {"type": {"const": "function_call"}, "id": {"type": "string"},
                           "call_id": {"type": "string"}, "name": {"type": "string"},
                           "arguments": {"type": "string", "description": "a JSON string"}}}
    usage = {"type": "object", "properties": {
        "input_tokens": n, "output_tokens": n, "total_tokens": n,
        "input_tokens_details": {"type": "object", "properties": {"cached_tokens": n}}}}
    return {"type": "object", "required": ["id", "object", "status", "output", "usage"],
            "properties": {"id": {"type": "string", "pattern": "^resp_"},
                           "object": {"const": "response"}, "created_at": n,
                           "status": {"enum": ["completed", "incomplete"]},
                           "output": {"type": "array", "items": {"oneOf": [message, call]}},
                           "usage": usage}}


def _completion_object(obj: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"const": obj}, "created": _int(0),
                           "model": {"type": "string"}, "choices": {"type": "array", "items": choice},
                           "usage": {"$ref": _REF.format(name="Usage")}}}


def _generate_op(summary: str, request: str, response: str) -> dict[str, Any]:
    ok = {"description": "The result; with stream: true, server-sent events ending in data: [DONE]",
          "content": {**_json(response), "text/event-stream": {"schema": _SSE_EVENT}}}
    return {"post": {"summary": summary, "security": [{"bearer": []}],
                     "requestBody": {"required": True, "content": _json(request)},
                     "responses": _responses(ok, *_GEN_ERRORS)}}


def _responses_op() -> dict[str, Any]:
    op = _generate_op("Responses API", "ResponsesRequest", "Response")
    op["post"]["responses"]["200"]["description"] = (
        "The response; with stream: true, typed server-sent events (event: response.created ... "
        "response.completed, each with sequence_number), no [DONE]")
    return op


def _simple_get(summary: str, schema: dict[str, Any], *errors: int, media: str = "application/json",
                secure: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": _responses(
        {"description": "OK", "content": {media: {"schema": schema}}}, *errors)}
    if secure:
        op["security"] = [{"bearer": []}]
    return {"get": op}


def _path_param(path_item: dict[str, Any], name: str) -> dict[str, Any]:
    return {**path_item, "parameters": [{"name": name, "in": "path", "required": True,
                                         "schema": {"type": "string"}}]}


def _token_op(summary: str, request: str, result: dict[str, Any]) -> dict[str, Any]:
    ok = {"description": "OK", "content": {"application/json": {"schema": result}}}
    return {"post": {"summary": summary, "security": [{"bearer": []}],
                     "requestBody": {"required": True, "content": _json(request)},
                     "responses": _responses(ok, 400, 401, 404, 413)}}


def openapi_schema(cfg: ServerConfig, info: ModelInfo, model_name: str) -> dict[str, Any]:
    obj = {"type": "object"}
    ids = {"type": "array", "items": _int(0)}
    paths = {
        "/v1/chat/completions": _generate_op("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _generate_op("Text completion", "CompletionRequest", "Completion"),
        "/v1/responses": _responses_op(),
        "/v1/responses/{response_id}": _path_param(_simple_get(
            "A stored response (bounded in-memory store)", {"$ref": _REF.format(name="Response")},
            401, 404, secure=True), "response_id"),
        "/v1/models": _simple_get("The served model", obj, 401, secure=True),
        "/health": _simple_get("200 when the engine can serve", obj, 503),
        "/version": _simple_get("Server version and engine", obj),
        "/metrics": _simple_get("Prometheus metrics", {"type": "string"}, media="text/plain"),
        "/debug/stats": _simple_get("engine.get_stats() as JSON", obj, 401, secure=True),
        "/debug/lifecycle": _simple_get("Every finished lifecycle trace (ring buffer)", obj, 401,
                                        secure=True),
        "/debug/lifecycle/{request_id}": _path_param(_simple_get(
            "One request's lifecycle events (traced with X-Twinserve-Trace: 1 or --trace)",
            obj, 401, 404, secure=True), "request_id"),
        "/openapi.json": _simple_get("This document", obj),
        "/tokenize": _token_op("Tokenize a prompt or chat", "TokenizeRequest", {
            "type": "object", "required": ["tokens", "count", "max_model_len"],
            "properties": {"tokens": ids, "count": _int(0), "max_model_len": _int(1)}}),
        "/detokenize": _token_op("Token ids to text", "DetokenizeRequest", {
            "type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "twinserve", "version": "0.1.0",
                 "description": f"OpenAI-compatible server for {model_name} (engine {cfg.engine})."},
        "paths": paths,
        "components": {"schemas": _components(cfg, info),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
