"""Incremental detokenization: new token ids in, new text out (lifecycle step 12).

Decoding one token alone is wrong for byte-level vocabularies (an emoji spans several
tokens, each a fragment of its UTF-8 bytes) and for tokenizers that strip a leading
space at the start of a decode. So each step decodes a short window of recent tokens
twice - with and without the new ones - and emits the difference:

    ids:   ... | prefix_offset ... read_offset | new tokens ...
                 \\__ prefix_text __________/
                 \\__ full_text ___________________________/
    delta = full_text[len(prefix_text):]

A delta ending in U+FFFD means a character is still incomplete: emit nothing and wait.
The window slides forward whenever text is emitted, so the cost per token stays bounded
(by the longest run of tokens that print nothing, in practice a handful).
"""
from __future__ import annotations

from shared.frontend.tokenizer import Tokenizer

# Prompt tokens kept as left context for the first decode (what vLLM uses too).
_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special_tokens
        # Only the prompt's tail matters as context; never decode the whole prompt.
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def append(self, token_ids: list[int]) -> str:
        """Add generated tokens; return the text they complete (maybe "")."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._ids))
        delta = full_text[len(prefix_text):]
        # Wait while a multi-byte character is split; also keep the window when nothing
        # printed (skipped special tokens), so it always holds some visible left context.
        if not delta or delta.endswith(_REPLACEMENT):
            return ""
        self._slide()
        return delta

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character, shown as U+FFFD)."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._ids))
        self._slide()
        return full_text[len(prefix_text):]

    def _slide(self) -> None:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Drop ids left of the window so the list does not grow with the output.
        if self._prefix_offset > 64:
            del self._ids[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0

    def _decode(self, start: int, end: int) -> str:
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip_special)
