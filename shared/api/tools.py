"""tools and tool_choice on /v1/chat/completions: validation, the tool grammar, the reply.

"auto" lets the model choose and parses what it writes; "required" and a named tool are
enforced by a grammar over the Hermes call format, so the output is always well-formed calls
whose arguments validate against the function's parameters.
"""
from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.api.protocol import ChatCompletionRequest
from shared.api.protocol_tools import NamedToolChoice, Tool
from shared.errors import ParamError
from shared.frontend.tool_parser import ArgsDelta, CallStart, Content, Event, HermesToolParser
from shared.messages import StructuredOutputsParams
from shared.structured.grammar import JSON_OPTIONS, validate


@dataclass
class ToolPlan:
    """How a request uses its tools: ``mode`` is auto, required or named."""

    mode: str
    tools: list[dict[str, Any]]         # OpenAI's tool objects, for the chat template
    spec: StructuredOutputsParams | None = None   # the call grammar (required, named)

    def parser(self) -> HermesToolParser:
        # Under the grammar the call format is certain, so arguments can stream as they come.
        return HermesToolParser(streaming_args=self.spec is not None)


def plan_tools(req: ChatCompletionRequest) -> ToolPlan | None:
    """None when the request makes no tool calls (no tools, or tool_choice "none")."""
    _check_messages(req)
    constrained = ((req.response_format is not None and req.response_format.type != "text")
                   or bool(req.structured_outputs))
    choice = req.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return plan(req.tools, choice if named is None else "named", named, req.parallel_tool_calls,
                constrained, lambda i: f"tools[{i}].function.parameters")


def plan(tools: list[Tool] | None, choice: str | None, named: str | None, parallel: bool | None,
         constrained: bool, params_param: Callable[[int], str]) -> ToolPlan | None:
    """The plan for chat and /v1/responses alike: ``choice`` is None, "none", "auto",
    "required" or "named" (the function ``named``); ``constrained``: the request also asks for
    response_format/structured_outputs."""
    if not tools:
        if choice is not None:
            raise ParamError("tool_choice is only allowed when tools are given", param="tool_choice")
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ParamError("tool function names must be unique", param="tools")
    for i, t in enumerate(tools):
        if t.function.parameters is not None:
            validate(StructuredOutputsParams(json=json.dumps(t.function.parameters)), params_param(i))
    if choice == "none":
        return None     # the model is not told of tools it may not call
    as_dicts = [msgspec.to_builtins(t) for t in tools]
    if choice is None or choice == "auto":
        return ToolPlan("auto", as_dicts)
    if constrained:
        raise ParamError("a required or named tool_choice cannot be combined with response_format "
                         "or structured_outputs", param="tool_choice")
    if choice == "required":
        grammar = call_grammar(tools, parallel is not False)
        return ToolPlan("required", as_dicts, StructuredOutputsParams(grammar=grammar))
    chosen = [t for t in tools if t.function.name == named]
    if not chosen:
        raise ParamError(f"tool_choice names {named!r}, which is not among the tools",
                         param="tool_choice")
    return ToolPlan("named", as_dicts, StructuredOutputsParams(grammar=call_grammar(chosen, False)))


def call_grammar(tools: list[Tool], parallel: bool) -> str:
    """Lark for one call (or several, with ``parallel``) of any of ``tools``, in Hermes form."""
    alternatives = [{
        "type": "object", "additionalProperties": False, "required": ["name", "arguments"],
        "properties": {"name": {"const": t.function.name},
                       "arguments": t.function.parameters or {"type": "object"}},
    } for t in tools]
    schema = {"anyOf": alternatives, "x-guidance": JSON_OPTIONS}
    repeat = ' ("\\n" call)*' if parallel else ""
    return (f"start: call{repeat}\n"
            'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
            f"body: %json {json.dumps(schema)}\n")


def _check_messages(req: ChatCompletionRequest) -> None:
    """OpenAI's cross-field rules: content may be null only on an assistant message that
    makes tool calls; a tool result names its call."""
    for i, m in enumerate(req.messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ParamError(f"a {m.role} message needs content (null only on an assistant "
                             "message with tool_calls)", param=f"messages[{i}].content")
        if m.role == "tool" and not m.tool_call_id:
            raise ParamError("a message with role 'tool' needs tool_call_id",
                             param=f"messages[{i}].tool_call_id")
        if m.tool_calls and m.role != "assistant":
            raise ParamError("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class ToolCallsState:
    """One choice's parser and the calls it has found (ids are made here)."""

    parser: HermesToolParser
    calls: list[dict[str, Any]]

    @classmethod
    def start(cls, plan: ToolPlan) -> ToolCallsState:
        return cls(plan.parser(), [])

    def deltas(self, events: list[Event]) -> tuple[str, list[dict[str, Any]]]:
        """Events -> (content text, OpenAI tool_call deltas), recording the calls."""
        text, deltas = "", []
        for e in events:
            if isinstance(e, Content):
                text += e.text
            elif isinstance(e, CallStart):
                call = {"id": new_call_id(), "type": "function",
                        "function": {"name": e.name, "arguments": ""}}
                self.calls.append(call)
                deltas.append({"index": e.index, **json.loads(json.dumps(call))})
            elif isinstance(e, ArgsDelta):
                self.calls[e.index]["function"]["arguments"] += e.text
                deltas.append({"index": e.index, "function": {"arguments": e.text}})
        return text, deltas
