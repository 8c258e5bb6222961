"""The OpenAPI 3.1 document of the server, written by hand from the same limits it enforces.

Ranges here must match requests.py exactly: a schema-based fuzzer sends values just outside
them and expects a 400, and values inside them and expects no 400 for that reason.
"""
from __future__ import annotations

from typing import Any

from shared.config import ServerConfig
from shared.model_info import ModelInfo

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _opt(schema: dict[str, Any]) -> dict[str, Any]:
    """The same schema, or null (every optional request field accepts null)."""
    return {"anyOf": [schema, {"type": "null"}]}


def _int(lo: int | None = None, hi: int | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def _num(lo: float | None = None, hi: float | None = None, exclusive_lo: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "number"}
    if lo is not None:
        s["exclusiveMinimum" if exclusive_lo else "minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def _sampling_fields(cfg: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    token_id = _int(0, info.vocab_size - 1)
    fields = {
        "model": {"type": "string"},
        "max_tokens": _int(1, info.max_model_len),
        "temperature": _num(0),
        "top_p": _num(0, 1, exclusive_lo=True),
        "top_k": _int(-1, _INT64_MAX),
        "min_p": _num(0, 1),
        "seed": _int(_INT64_MIN, _INT64_MAX),
        "n": _int(1, cfg.max_n),
        "stop": {"anyOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "maxItems": cfg.max_stop_strings,
                            "items": {"type": "string", "minLength": 1}}]},
        "stop_token_ids": {"type": "array", "items": token_id},
        "presence_penalty": _num(-2, 2),
        "frequency_penalty": _num(-2, 2),
        "repetition_penalty": _num(0, 10, exclusive_lo=True),
        "ignore_eos": {"type": "boolean"},
        "min_tokens": _int(0, info.max_model_len),
        "include_stop_str_in_output": {"type": "boolean"},
        "skip_special_tokens": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": _opt({"type": "boolean"})}},
        "user": {"type": "string"},
    }
    return {k: _opt(v) for k, v in fields.items()}


def _message_schema() -> dict[str, Any]:
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    return {"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "user", "assistant", "tool", "developer"]},
        "content": _opt({"anyOf": [{"type": "string"}, {"type": "array", "items": part}]}),
        "name": _opt({"type": "string"}),
        "tool_call_id": _opt({"type": "string"}),
    }}


def _chat_request(cfg: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    props = _sampling_fields(cfg, info)
    props.update({
        "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}},
        "max_completion_tokens": _opt(_int(1, info.max_model_len)),
        "logprobs": _opt({"type": "boolean"}),
        "top_logprobs": _opt(_int(0, cfg.max_logprobs)),
        "add_generation_prompt": _opt({"type": "boolean"}),
    })
    needs_logprobs = {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
                      "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
    return {"type": "object", "required": ["messages"], "properties": props, **needs_logprobs,
            "description": "max_tokens plus the prompt's tokens must fit max_model_len; "
                           "top_logprobs needs logprobs: true. Unknown fields are ignored."}


def _completion_request(cfg: ServerConfig, info: ModelInfo) -> dict[str, Any]:
    ids = {"type": "array", "minItems": 1, "items": _int(0, info.vocab_size - 1)}
    text = {"type": "string", "minLength": 1}
    props = _sampling_fields(cfg, info)
    props.update({
        "prompt": {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}, ids,
                             {"type": "array", "minItems": 1, "items": ids}]},
        "logprobs": _opt(_int(0, cfg.max_logprobs)),
        "echo": _opt({"type": "boolean"}),
    })
    return {"type": "object", "required": ["prompt"], "properties": props,
            "description": "max_tokens (default 16) plus the prompt's tokens must fit "
                           "max_model_len. Unknown fields are ignored."}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


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
        "Error": error, "Usage": usage, "ChatMessage": _message_schema(),
        "ChatCompletionRequest": _chat_request(cfg, info),
        "CompletionRequest": _completion_request(cfg, info),
        "ChatCompletion": _completion_object("chat.completion", chat_choice),
        "Completion": _completion_object("text_completion", text_choice),
        "TokenizeRequest": _tokenize_request(),
        "DetokenizeRequest": {"type": "object", "required": ["tokens"], "properties": {
            "model": _opt({"type": "string"}),
            "tokens": {"type": "array", "items": _int(0, info.vocab_size - 1)}}},
    }


def _tokenize_request() -> dict[str, Any]:
    messages = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}}
    return {"type": "object", "description": "Give exactly one of prompt or messages.",
            "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
            "properties": {"model": _opt({"type": "string"}), "prompt": {"type": "string"},
                           "messages": messages, "add_special_tokens": _opt({"type": "boolean"}),
                           "add_generation_prompt": _opt({"type": "boolean"})}}


def _completion_object(obj: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"const": obj}, "created": _int(0),
                           "model": {"type": "string"}, "choices": {"type": "array", "items": choice},
                           "usage": {"$ref": "#/components/schemas/Usage"}}}


def _generate_op(summary: str, request: str, response: str) -> dict[str, Any]:
    ok = {"description": "The result; with stream: true, server-sent events ending in data: [DONE]",
          "content": {**_json(response), "text/event-stream": {"schema": _SSE_EVENT}}}
    return {"post": {"summary": summary, "security": [{"bearer": []}],
                     "requestBody": {"required": True, "content": _json(request)},
                     "responses": _responses(ok, *_GEN_ERRORS)}}


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
