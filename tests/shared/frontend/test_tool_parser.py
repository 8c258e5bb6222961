"""HermesToolParser: any split of a text into deltas gives the same content and calls as the
whole text at once (a property test over generated outputs), and the calls are the ones written."""
from __future__ import annotations

import json
import random

import pytest

from shared.frontend.tool_parser import ArgsDelta, CallStart, Content, HermesToolParser

ALPHABET = ['a', 'Z', ' ', '{', '}', '[', ']', '"', '\\', ':', ',', '<', '>', '/', '\n', 'é', '😀',
            'tool', '_call', '<tool', '</tool_call', 'ñ', '\\"', '\\\\', '"}']


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n)).replace("<tool_call>", "<tool call>")


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return _random_text(rng, rng.randrange(0, 8))
    if kind == 1:
        return rng.randrange(-1000, 1000)
    if kind == 2:
        return rng.choice([True, False, None, 1.5])
    if kind == 3:
        return _random_text(rng, 3).replace("\\", "/")
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))]
    return {f"k{i}{_random_text(rng, 2)}": _random_value(rng, depth + 1) for i in range(rng.randrange(0, 3))}


def _call_text(name: str, args: dict) -> str:
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            + "\n</tool_call>")


def _aggregate(parser: HermesToolParser, deltas: list[str]) -> tuple[str, list[tuple[str, str]]]:
    events = [e for d in deltas for e in parser.feed(d)] + parser.finish()
    content, calls = "", []
    for e in events:
        if isinstance(e, Content):
            content += e.text
        elif isinstance(e, CallStart):
            assert e.index == len(calls)
            calls.append([e.name, ""])
        else:
            assert isinstance(e, ArgsDelta) and e.index == len(calls) - 1
            calls[e.index][1] += e.text
    return content, [tuple(c) for c in calls]


def _random_split(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randrange(0, 30)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("streaming_args", [True, False])
def test_any_split_gives_the_same_content_and_calls(streaming_args: bool) -> None:
    rng = random.Random(1234 + streaming_args)
    for _ in range(400):
        parts, want_content, want_calls = [], "", []
        for _ in range(rng.randrange(0, 4)):
            text = _random_text(rng, rng.randrange(0, 12)) if not want_calls else ""
            name = "f_" + _random_text(rng, 3).replace('"', "q").replace("\\", "b")
            args = {f"p{i}": _random_value(rng) for i in range(rng.randrange(0, 4))}
            parts += [text, _call_text(name, args)]
            want_content += text
            want_calls.append((name, args))
        if not want_calls:
            tail = _random_text(rng, rng.randrange(0, 20))
            parts.append(tail)
            want_content += tail
        full = "".join(parts)
        whole = _aggregate(HermesToolParser(streaming_args), [full])
        split = _aggregate(HermesToolParser(streaming_args), _random_split(rng, full))
        assert split == whole, full
        content, calls = whole
        # Whitespace next to a call is layout and dropped; all other text is kept.
        assert "".join(content.split()) == "".join(want_content.split())
        if not want_calls:
            assert content == want_content
        assert [(n, json.loads(a)) for n, a in calls] == want_calls, full


def test_a_malformed_call_in_free_text_stays_content() -> None:
    text = 'Sure! <tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call> done'
    content, calls = _aggregate(HermesToolParser(streaming_args=False), [text])
    assert calls == [] and content == text


def test_streamed_arguments_arrive_in_fragments_and_end_with_the_object() -> None:
    parser = HermesToolParser(streaming_args=True)
    text = _call_text("get_weather", {"city": "Paris \"}\" {", "days": [1, 2]})
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    starts = [e for e in events if isinstance(e, CallStart)]
    frags = [e.text for e in events if isinstance(e, ArgsDelta)]
    assert [s.name for s in starts] == ["get_weather"] and len(frags) > 5
    assert json.loads("".join(frags)) == {"city": "Paris \"}\" {", "days": [1, 2]}
    assert not any(isinstance(e, Content) and e.text.strip() for e in events)


def test_a_cut_off_call_keeps_what_was_streamed() -> None:
    text = _call_text("f", {"a": "long value"})[:-30]
    content, calls = _aggregate(HermesToolParser(streaming_args=True), [text])
    assert calls[0][0] == "f" and content == ""
    content, calls = _aggregate(HermesToolParser(streaming_args=False), [text])
    assert calls == [] and content == text
