from __future__ import annotations

import pytest

from shared.frontend.detokenizer import IncrementalDetokenizer
from shared.frontend.tokenizer import Tokenizer

TEXTS = [
    "héllo 世界 🎉🎉 ok",
    "  leading spaces,\n\ttabs and 日本語のテキスト。 👩‍👩‍👧 family",
    " The quick brown fox.",
]


@pytest.fixture(scope="module")
def tok(default_model_dir: str) -> Tokenizer:
    return Tokenizer(default_model_dir)


def stream(tok: Tokenizer, ids: list[int], prompt: list[int], skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    return [detok.append([t]) for t in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_matches_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    prompt = tok.encode("<|im_start|>assistant\n")
    deltas = stream(tok, ids, prompt)
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_multibyte_tokens_wait_for_the_whole_character(tok: Tokenizer) -> None:
    ids = tok.encode("🎉")
    assert len(ids) > 1                             # byte-level pieces of one emoji
    deltas = stream(tok, ids, [])
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🎉"


def test_chunked_appends_match_full_decode(tok: Tokenizer) -> None:
    ids = tok.encode(TEXTS[1])
    detok = IncrementalDetokenizer(tok, tok.encode("Say:"), skip_special_tokens=True)
    out = "".join(detok.append(ids[i:i + 3]) for i in range(0, len(ids), 3))
    assert out == TEXTS[1]


def test_leading_space_token_keeps_its_space(tok: Tokenizer) -> None:
    prompt = tok.encode("Hello")
    ids = tok.encode(" world")
    deltas = stream(tok, ids, prompt)
    assert deltas[0].startswith(" ") and deltas[0] == tok.decode(ids[:1])
    assert "".join(deltas) == " world"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tok: Tokenizer, skip: bool) -> None:
    eos = tok.token_to_id("<|im_end|>")
    ids = tok.encode("Hi 🎉") + [eos] + tok.encode(" after")
    text = "".join(stream(tok, ids, tok.encode("x"), skip=skip))
    assert text == ("Hi 🎉 after" if skip else "Hi 🎉<|im_end|> after")
    assert text == tok.decode(ids, skip_special_tokens=skip)


def test_flush_returns_incomplete_tail(tok: Tokenizer) -> None:
    ids = tok.encode("ok 🎉")
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    text = "".join(detok.append([t]) for t in ids[:-1])
    assert text == "ok"
    tail = detok.flush()
    assert text + tail == tok.decode(ids[:-1]) and tail.endswith("\ufffd")
    assert detok.flush() == ""


def test_window_stays_small_on_long_outputs(tok: Tokenizer) -> None:
    ids = tok.encode("word 世界 " * 300)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    out = "".join(detok.append([t]) for t in ids)
    assert out == tok.decode(ids)
    assert len(detok._ids) < 80                     # old ids are dropped, cost stays bounded
