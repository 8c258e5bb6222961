"""Request bodies of the OpenAI endpoints as msgspec Structs (lifecycle step 2).

Decoding checks types only; ``requests.py`` checks ranges and builds SamplingParams. Unknown
fields are ignored, as OpenAI and vLLM clients expect. Every field may be null (= default).
"""
from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

import msgspec

from shared.api.errors import APIError

Role = Literal["system", "user", "assistant", "tool", "developer"]


class ContentPart(msgspec.Struct):
    type: Literal["text"]       # only text parts: this server has no vision model
    text: str


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Common(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI's plus vLLM's sampling extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = None


class CompletionRequest(_Common, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of lists of token ids;
    # mixing is rejected in requests.py.
    prompt: str | list[str | int | list[int]]
    logprobs: int | None = None
    echo: bool | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | msgspec.UnsetType = msgspec.UNSET          # exactly one of prompt, messages
    messages: list[ChatMessage] | msgspec.UnsetType = msgspec.UNSET
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


T = TypeVar("T")
_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.+)`")


def decode_body(body: bytes, cls: type[T]) -> T:
    """JSON body -> Struct; malformed JSON, wrong types and missing fields become 400s."""
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
    """'Expected `int`, got `str` - at `$.max_tokens`' -> 'max_tokens' (missing field too)."""
    at = _AT.search(message)
    path = at.group(1) if at else ""
    missing = _MISSING.match(message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def to_builtins(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template (None fields left out)."""
    return msgspec.to_builtins(messages)
