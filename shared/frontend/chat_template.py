"""Chat templates rendered the way HF's ``apply_chat_template`` renders them (step 2).

Real templates use HF's Jinja additions: ``tojson`` with json.dumps' options, ``strftime_now``,
``raise_exception``, the ``{% generation %}`` tag and loop controls. A template that knows no
tools gets them through a system prompt instead (``fallback_tool_messages``): the tools as JSON
and the Hermes call format the tool parser reads.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar

from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.errors import ParamError

TOOL_PROMPT = """You can call these functions, described as JSON schemas:
<tools>
{tools}
</tools>
To call a function, reply with one block per call, and nothing else:
<tool_call>
{{"name": <function name>, "arguments": <arguments as a JSON object>}}
</tool_call>"""


class GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: HF marks assistant text with it; rendering
    is just the body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's filter (not Jinja's HTML-safe one): plain json.dumps with its options."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def raise_exception(message: str) -> None:
    raise ParamError(f"chat template error: {message}", param="messages")


def compile_template(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(source)


def supports_tools(source: str) -> bool:
    """Whether the template itself renders ``tools`` (else the fallback prompt is used)."""
    return "tools" in source


def call_text(name: str, arguments: Any) -> str:
    """One call in the Hermes format (arguments: a dict, or a JSON string as OpenAI sends)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def fallback_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                           ) -> list[dict[str, Any]]:
    """Messages for a template without tool support: the tools in the system prompt, calls
    and tool results written out as text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            text = "\n".join(([m["content"]] if m.get("content") else []) + calls)
            out.append({"role": "assistant", "content": text})
        elif m.get("role") == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    if tools:
        prompt = TOOL_PROMPT.format(tools="\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools))
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template with tool support: call arguments as objects, as HF's
    templates expect (OpenAI sends them as JSON strings)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                try:
                    fn["arguments"] = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                except ValueError:
                    pass
                calls.append({**c, "function": fn})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
