"""Token text for logprobs, and the chat and completions logprobs shapes of OpenAI."""
from __future__ import annotations

from shared.frontend.tokenizer import Tokenizer
from shared.messages import TokenLogprobs


def _byte_level_alphabet() -> dict[str, int]:
    """The printable stand-ins byte-level BPE uses for raw bytes, mapped back to the bytes.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to 256+,
    in byte order, so every byte gets a visible character.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in keep}
    shifted = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_ALPHABET = _byte_level_alphabet()


class TokenText:
    """Per-token text and UTF-8 bytes, cached; exact bytes for byte-level BPE vocabularies."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.id_to_token(token_id)
        if raw is not None and raw and all(ch in _ALPHABET for ch in raw):
            data = bytes(_ALPHABET[ch] for ch in raw)
            return data.decode("utf-8", errors="replace"), list(data)
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))


def chat_logprobs(items: list[TokenLogprobs], texts: TokenText) -> list[dict]:
    """Entries of a chat choice's ``logprobs.content`` list."""
    content = []
    for lp in items:
        text, data = texts.get(lp.token_id)
        top = []
        for tid, tlp in zip(lp.top_ids, lp.top_logprobs):
            ttext, tdata = texts.get(tid)
            top.append({"token": ttext, "logprob": tlp, "bytes": tdata})
        content.append({"token": text, "logprob": lp.logprob, "bytes": data, "top_logprobs": top})
    return content


class CompletionLogprobs:
    """Builds the legacy completions logprobs object, tracking text offsets across deltas."""

    def __init__(self, texts: TokenText, offset: int = 0) -> None:
        self.texts = texts
        self.offset = offset

    def prompt(self, token_ids: list[int], scored: list[TokenLogprobs | None] | None,
               k: int) -> dict:
        """Echoed prompt tokens: the first has no logprob (null), as OpenAI and vLLM."""
        tokens = [self.texts.get(t)[0] for t in token_ids]
        if scored is None or len(scored) != len(token_ids):
            return self._block(tokens, [None] * len(tokens), [None] * len(tokens))
        values, tops = [], []
        for tok, lp in zip(tokens, scored):
            values.append(None if lp is None else lp.logprob)
            tops.append(None if lp is None else self._top(tok, lp, k))
        return self._block(tokens, values, tops)

    def delta(self, items: list[TokenLogprobs]) -> dict:
        tokens, values, tops = [], [], []
        for lp in items:
            tokens.append(self.texts.get(lp.token_id)[0])
            values.append(lp.logprob)
            tops.append(self._top(tokens[-1], lp, len(lp.top_ids)))
        return self._block(tokens, values, tops)

    def _top(self, token: str, lp: TokenLogprobs, k: int) -> dict:
        top = {self.texts.get(t)[0]: v for t, v in zip(lp.top_ids[:k], lp.top_logprobs[:k])}
        top.setdefault(token, lp.logprob)
        return top

    def _block(self, tokens: list[str], values: list, tops: list) -> dict:
        offsets = []
        for tok in tokens:
            offsets.append(self.offset)
            self.offset += len(tok)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def merge_completion_logprobs(blocks: list[dict]) -> dict | None:
    if not blocks:
        return None
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for block in blocks:
        for key in merged:
            merged[key].extend(block[key])
    return merged


def vllm_prompt_logprobs(items: list[TokenLogprobs | None], texts: TokenText,
                         k: int) -> list[dict | None]:
    """vLLM's prompt_logprobs shape: per prompt token None (the first) or
    {token id: {logprob, rank, decoded_token}} for the token itself and its top-k."""
    out: list[dict | None] = []
    for lp in items:
        if lp is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": v, "rank": r + 1, "decoded_token": texts.get(t)[0]}
                 for r, (t, v) in enumerate(zip(lp.top_ids[:k], lp.top_logprobs[:k]))}
        entry.setdefault(str(lp.token_id), {"logprob": lp.logprob, "rank": lp.rank,
                                            "decoded_token": texts.get(lp.token_id)[0]})
        out.append(entry)
    return out
