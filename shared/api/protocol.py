"""Request bodies of the OpenAI endpoints as msgspec Structs (lifecycle step 2).

The single source of the request schema: types and every static bound are declared here as
``msgspec.Meta`` and checked while decoding; /openapi.json is generated from these Structs
(openapi.py). Bounds that depend on the server config or the model cannot be static, so they
carry a ``config_max`` marker: requests.py checks them by hand and openapi.py fills in the
served value. Unknown fields are ignored, as OpenAI and vLLM clients expect. Every optional
field may be null (= default).
"""
from __future__ import annotations

import re
from itertools import accumulate
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from shared.api.errors import APIError
from shared.api.protocol_tools import (
    NamedToolChoice,
    ResponseFormat,
    ResponsesFunctionTool,
    ResponsesNamedToolChoice,
    StructuredOutputs,
    Tool,
    ToolCall,
)

LIMIT_KEY = "x-twinserve-limit"


def config_max(limit: str, keyword: str = "maximum") -> Meta:
    """Mark an upper bound named ``limit`` (a key of openapi.py's limits) as config-dependent."""
    return Meta(extra_json_schema={LIMIT_KEY: {keyword: limit}})


_INT64 = 1 << 63
# v1 carries SamplingParams over msgpack, whose integers are at most 64-bit.
Int64 = Annotated[int, Meta(ge=-_INT64, le=_INT64 - 1)]
TokenId = Annotated[int, Meta(ge=0), config_max("max_token_id")]
Text = Annotated[str, Meta(min_length=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
MaxTokens = Annotated[int, Meta(ge=1), config_max("max_model_len")]
StopList = Annotated[list[Text], config_max("max_stop_strings", "maxItems")]
# One union may hold only one array type, so prompt decodes as str | list[str | id | ids];
# requests.py rejects mixing and openapi.py states the four shapes separately.
Prompt = Text | Annotated[list[Text | TokenId | Annotated[list[TokenId], Meta(min_length=1)]],
                          Meta(min_length=1)]

Role = Literal["system", "user", "assistant", "tool", "developer"]


class ContentPart(msgspec.Struct):
    type: Literal["text"]       # only text parts: this server has no vision model
    text: str


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


Messages = Annotated[list[ChatMessage], Meta(min_length=1)]


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None
    continuous_usage_stats: Annotated[bool, Meta(
        description="vLLM's extension: with include_usage, usage on every chunk")] | None = None


# OpenAI's logit_bias: token id (as a string key) -> bias added to its logit.
LogitBias = Annotated[dict[str, Annotated[float, Meta(ge=-100, le=100)]],
                      Meta(max_length=300, description="token id -> bias in [-100, 100]")]
PromptLogprobs = Annotated[int, Meta(ge=0, description="vLLM's extension; not with stream"),
                           config_max("max_logprobs")]


class _Common(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI's plus vLLM's sampling extras)."""

    model: str | None = None
    max_tokens: Annotated[MaxTokens, Meta(description="plus the prompt must fit max_model_len")] | None = None
    temperature: Annotated[float, Meta(ge=0, description="0: greedy")] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=_INT64 - 1, description="-1 or 0: disabled")] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    seed: Int64 | None = None
    n: Annotated[int, Meta(ge=1), config_max("max_n")] | None = None
    stop: Text | StopList | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=10)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0, description="capped at max_tokens"),
                          config_max("max_model_len")] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: LogitBias | None = None
    prompt_logprobs: PromptLogprobs | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    priority: Annotated[Int64, Meta(
        description="vLLM's extension: lower runs first; needs --scheduling-policy priority")] | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    """max_tokens plus the prompt's tokens must fit max_model_len; top_logprobs needs
    logprobs: true. Unknown fields are ignored."""

    messages: Messages
    max_completion_tokens: Annotated[MaxTokens, Meta(description="OpenAI's newer name; wins")] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0), config_max("max_logprobs")] | None = None
    add_generation_prompt: bool | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice, Meta(
        description='default "auto" with tools; "required" and a named tool are enforced by a grammar'
    )] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Common, kw_only=True):
    """max_tokens (default 16) plus the prompt's tokens must fit max_model_len.
    Unknown fields are ignored."""

    prompt: Annotated[Prompt, Meta(description="text, texts, token ids, or lists of token ids")]
    logprobs: Annotated[int, Meta(ge=0), config_max("max_logprobs")] | None = None
    echo: bool | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """Give exactly one of prompt or messages."""

    model: str | None = None
    prompt: str | msgspec.UnsetType = msgspec.UNSET
    messages: Messages | msgspec.UnsetType = msgspec.UNSET
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


class InputContent(msgspec.Struct):
    type: Literal["input_text", "output_text"]   # text only: this server has no vision model
    text: str


class ResponseInputItem(msgspec.Struct, kw_only=True):
    """A message (type omitted or "message"), a function_call or a function_call_output."""

    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Role | None = None
    content: str | list[InputContent] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    """Responses' text.format: chat's response_format with the json_schema fields inline."""

    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseText(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """POST /v1/responses. store (default true) keeps the response in a bounded in-memory
    store for GET /v1/responses/{id} and previous_response_id. Unknown fields are ignored."""

    model: str | None = None
    input: Text | Annotated[list[ResponseInputItem], Meta(min_length=1)]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    text: ResponseText | None = None
    tools: Annotated[list[ResponsesFunctionTool], Meta(max_length=128)] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | ResponsesNamedToolChoice, Meta(
        description='default "auto" with tools; "required" and a named tool are enforced by a grammar'
    )] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


REQUEST_TYPES = (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest,
                 ResponsesRequest)

T = TypeVar("T")
_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
_BOUND = re.compile(r"^Expected `[^`]+` (of length )?[<>]")   # a Meta constraint, not a type
_INDEX = re.compile(r"(\[\d+\])+$")


# Hostile-input bounds checked before msgspec builds anything: far past any real request
# (a prompt of token ids is one flat list), low enough that decoding stays cheap.
MAX_JSON_DEPTH = 64
MAX_JSON_ELEMENTS = 500_000
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def check_json_shape(body: bytes) -> None:
    """400 for a body nested deeper than MAX_JSON_DEPTH or with more than MAX_JSON_ELEMENTS."""
    bare = _STRING.sub(b'""', body)
    if bare.count(b",") + bare.count(b"[") + bare.count(b"{") > MAX_JSON_ELEMENTS:
        raise APIError(400, f"request body has more than {MAX_JSON_ELEMENTS} JSON elements")
    brackets = bare.translate(None, _NOT_BRACKET)
    depth = max(accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)
    if depth > MAX_JSON_DEPTH:
        raise APIError(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels")


def decode_body(body: bytes, cls: type[T]) -> T:
    """JSON body -> Struct; malformed JSON, wrong types, bounds and missing fields become 400s."""
    check_json_shape(body)
    try:
        try:
            return msgspec.json.decode(body, type=cls)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
            # JSON Schema counts 3.0 as an integer; accept integral floats, reject 3.5.
            return msgspec.convert(_integral_floats(msgspec.json.decode(body)), cls)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = _param_of(message)
        raise APIError(400, message, param) from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None


def _integral_floats(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, list):
        return [_integral_floats(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _integral_floats(v) for k, v in obj.items()}
    return obj


def _param_of(message: str) -> str | None:
    """'Expected `int`, got `str` - at `$.max_tokens`' -> 'max_tokens' (missing field too).

    A bound broken by a list element (an empty stop string, a negative token id) names the
    list itself, as OpenAI does and as the hand checks did: 'stop', not 'stop[0]'.
    """
    at = _AT.search(message)
    path = at.group(1) if at else ""
    missing = _MISSING.match(message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    elif _BOUND.match(message):
        path = _INDEX.sub("", path)
    return path or None


def to_builtins(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template (None fields left out)."""
    return msgspec.to_builtins(messages)
