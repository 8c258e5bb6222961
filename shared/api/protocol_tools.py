"""Request Structs for output constraints and tools (response_format, structured_outputs,
tools, tool_choice, assistant tool_calls): part of protocol.py's single request schema."""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: Annotated[str, Meta(description="the arguments as a JSON string")]


class ToolCall(msgspec.Struct, kw_only=True):
    """A call the assistant made, as a client sends it back in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(msgspec.Struct, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: Annotated[dict[str, Any], Meta(description="JSON schema of the arguments")] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class ToolChoiceFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: ToolChoiceFunction


class ResponsesFunctionTool(msgspec.Struct, kw_only=True):
    """A /v1/responses function tool: chat's function definition, flat."""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: Annotated[dict[str, Any], Meta(description="JSON schema of the arguments")] | None = None
    strict: bool | None = None

    def as_chat(self) -> Tool:
        return Tool(type="function", function=FunctionDef(
            name=self.name, description=self.description, parameters=self.parameters,
            strict=self.strict))


class ResponsesNamedToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: str


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    schema: Annotated[dict[str, Any], Meta(description="JSON schema; omitted: any JSON object")] | None = None
    strict: Annotated[bool, Meta(description="accepted; the output always follows the schema")] | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's response_format: text (the default), json_object or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's structured_outputs: exactly one of json, json_object, regex, choice, grammar."""

    json: Annotated[dict[str, Any] | bool | str, Meta(description="a JSON schema (object or text)")] | None = None
    json_object: bool | None = None
    regex: Annotated[str, Meta(description="Rust regex syntax")] | None = None
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    grammar: Annotated[str, Meta(description="GBNF (llama.cpp's dialect) or Lark")] | None = None
