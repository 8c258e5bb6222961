"""Tokenizer and chat template (lifecycle steps 2-3), read from an HF-format folder.

Uses the ``tokenizers`` library and a sandboxed Jinja environment directly, so start-up
does not import transformers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _RustTokenizer

from shared.errors import ParamError
from shared.frontend.chat_template import (
    compile_template,
    fallback_tool_messages,
    supports_tools,
    template_messages,
)


class Tokenizer:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self._tok = _RustTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = _read_json(folder / "tokenizer_config.json")
        self.chat_template: str | None = _load_chat_template(folder, cfg)
        self.bos_token: str | None = _token_text(cfg.get("bos_token"))
        self.eos_token: str | None = _token_text(cfg.get("eos_token"))
        self.eos_token_id: int | None = self.token_to_id(self.eos_token) if self.eos_token else None
        gen = _read_json(folder / "generation_config.json")
        eos = gen.get("eos_token_id")
        if self.eos_token_id is None and isinstance(eos, int):
            self.eos_token_id = eos
        self.special_token_ids: set[int] = {
            i for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        }
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self._template = compile_template(self.chat_template) if self.chat_template else None
        self.template_supports_tools = bool(self.chat_template) and supports_tools(self.chat_template)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The raw vocabulary string of one token (byte-level form, e.g. 'Ġthe')."""
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> str:
        """Render OpenAI-style messages; list-of-parts content is joined into one string.

        ``tools`` (OpenAI's tool objects) go to the template as HF passes them, or into a
        system prompt when the template has no tool support."""
        if self._template is None:
            raise ParamError("this model has no chat template; use /v1/completions", param="messages")
        if self.template_supports_tools:
            messages = template_messages(messages)
            if tools:
                kwargs["tools"] = tools
        else:
            messages = fallback_tool_messages(messages, tools)
        flat = [{**m, "content": _flatten_content(m.get("content"))} for m in messages]
        return self._template.render(
            messages=flat, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs,
        )


def _flatten_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise ParamError("only text content parts are supported", param="messages")
    return "".join(parts)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _load_chat_template(folder: Path, cfg: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    tmpl = cfg.get("chat_template")
    return tmpl if isinstance(tmpl, str) else None
