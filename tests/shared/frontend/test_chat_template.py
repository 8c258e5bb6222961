"""Chat templates get HF's Jinja additions and tools, or the system-prompt fallback."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shared.errors import ParamError
from shared.frontend.chat_template import TOOL_PROMPT, call_text, compile_template
from shared.frontend.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add",
                                           "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
HISTORY = [{"role": "user", "content": "2+3?"},
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
# A template in the style of Qwen2.5 / Hermes: tools in the system turn, calls as tool_call blocks.
TOOL_TEMPLATE = """{%- if tools %}<tools>{% for t in tools %}{{ t | tojson(indent=None, separators=(',', ':')) }}{% endfor %}</tools>
{% endif %}
{%- for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments.a }}
{% endfor %}{% elif m.role == 'tool' %}RESULT {{ m.tool_call_id }}={{ m.content }}
{% else %}{% generation %}{{ m.role }}: {{ m.content }}{% endgeneration %}
{% endif %}{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}"""


def _tokenizer(tmp_path: Path, template: str, default_model_dir: str) -> Tokenizer:
    src = Path(default_model_dir)
    (tmp_path / "tokenizer.json").write_text((src / "tokenizer.json").read_text())
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return Tokenizer(tmp_path)


def test_a_template_with_tools_gets_them_and_call_arguments_as_objects(tmp_path: Path,
                                                                       default_model_dir: str) -> None:
    tok = _tokenizer(tmp_path, TOOL_TEMPLATE, default_model_dir)
    assert tok.template_supports_tools
    text = tok.apply_chat_template(HISTORY, add_generation_prompt=False, tools=TOOLS)
    assert text.startswith('<tools>{"type":"function","function":{"name":"add"')
    assert "CALL add 1" in text and "RESULT call_1=5" in text and "user: 2+3?" in text


def test_a_template_without_tools_gets_the_fallback_prompt(default_model_dir: str) -> None:
    tok = Tokenizer(default_model_dir)      # SmolLM2's template knows no tools
    assert not tok.template_supports_tools
    text = tok.apply_chat_template(HISTORY, tools=TOOLS)
    assert TOOL_PROMPT.splitlines()[0] in text
    assert json.dumps(TOOLS[0]["function"]) in text
    assert call_text("add", '{"a": 1}') in text          # the assistant's call, written out
    assert "<tool_response>\n5\n</tool_response>" in text
    plain = tok.apply_chat_template(HISTORY[:1])
    assert "<tools>" not in plain


def test_hf_jinja_additions() -> None:
    t = compile_template("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ strftime_now('%Y') }}")
    compact, indented, year = t.render(x={"é": [1]}).split("|")
    assert compact == '{"é": [1]}' and indented == '{\n  "é": [\n    1\n  ]\n}'
    assert re.fullmatch(r"20\d\d", year)
    with pytest.raises(ParamError, match="no system"):
        compile_template("{{ raise_exception('no system') }}").render()
