"""Tool calls parsed out of generated text, incrementally (lifecycle step 12).

The format is Hermes': ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, the one
most open models' templates teach and the one the tool grammar (shared/api/tools.py) forces.
A parser is fed text deltas and returns events; feeding the whole text at once yields the same
content, names and arguments as any split of it, so a stream concatenates to the
non-streamed answer. Parsers are pluggable behind ``ToolParser``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The head of a well-formed call, as the tool grammar writes it (compact separators).
_HEAD = re.compile(r'\s*\{"name": "((?:[^"\\]|\\.)*)", "arguments": ')


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    name: str


@dataclass
class ArgsDelta:
    index: int
    text: str


Event = Content | CallStart | ArgsDelta


class ToolParser(Protocol):
    def feed(self, delta: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class HermesToolParser:
    """``streaming_args``: the text is known to follow the tool grammar, so arguments stream
    as they are generated. Otherwise (tool_choice "auto", free text) a call is emitted only
    once it is complete and valid JSON; anything else between the tags stays content."""

    def __init__(self, streaming_args: bool) -> None:
        self.streaming_args = streaming_args
        self.num_calls = 0
        self._buf = ""              # text not yet turned into events
        self._inside = False        # after <tool_call>, before its </tool_call>
        self._args_from: int | None = None   # where the arguments start in _buf (streaming)
        self._args_sent = 0
        self._args_done = False
        # Whitespace around calls is layout, not content: what follows a call is dropped, and
        # trailing whitespace waits here until text (kept) or a call (dropped) comes after it.
        self._after_call = False
        self._pending_ws = ""
        self._ws_before_call = ""

    def feed(self, delta: str) -> list[Event]:
        self._buf += delta
        events: list[Event] = []
        while True:
            step = self._inside_step() if self._inside else self._outside_step()
            if step is None:
                return events
            events.extend(step)

    def finish(self) -> list[Event]:
        """The end of the output: text held back is content, unless a call already began."""
        rest, self._buf = self._buf, ""
        if self._inside and self._args_from is not None:
            return []               # cut inside a streamed call: its arguments went out already
        if self._inside:
            self._after_call = False
            rest = self._ws_before_call + OPEN + rest
        events = self._content(rest)
        if self.num_calls == 0 and self._pending_ws:
            events.append(Content(self._pending_ws))
        return events

    def _outside_step(self) -> list[Event] | None:
        at = self._buf.find(OPEN)
        if at < 0:
            keep = _partial_suffix(self._buf, OPEN)   # may be the start of a tag
            text, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            return self._content(text) or None
        text, self._buf = self._buf[:at], self._buf[at + len(OPEN):]
        events = self._content(text)
        # Dropped if this turns out to be a call; kept if it is just text between tags.
        self._ws_before_call, self._pending_ws = self._pending_ws, ""
        self._inside, self._args_from, self._args_sent, self._args_done = True, None, 0, False
        return events

    def _content(self, text: str) -> list[Event]:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        core = text.rstrip()
        if not core:
            self._pending_ws += text
            return []
        out, self._pending_ws = self._pending_ws + core, text[len(core):]
        return [Content(out)]

    def _inside_step(self) -> list[Event] | None:
        if self.streaming_args:
            return self._stream_call()
        end = self._whole_call_end()
        if end is None:
            return None
        body, self._buf = self._buf[:end], self._buf[end + len(CLOSE):]
        self._inside = False
        events = self._whole_call(body)
        self._after_call = bool(events) and isinstance(events[0], CallStart)
        return events

    def _whole_call_end(self) -> int | None:
        """Where the call's closing tag starts: after its JSON object (string-aware, so an
        argument may contain the tag's text), or the first tag when the body is no object."""
        start = len(self._buf) - len(self._buf.lstrip())
        end = _value_end(self._buf, start) if self._buf[start:start + 1] == "{" else start
        if end is None:
            return None
        after = self._buf[end:]
        gap = len(after) - len(after.lstrip())
        if after[gap:].startswith(CLOSE):
            return end + gap
        if CLOSE.startswith(after[gap:]):
            return None             # the tag may still be coming
        close = self._buf.find(CLOSE, end)
        return None if close < 0 else close

    def _whole_call(self, body: str) -> list[Event]:
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments", {}), dict)):
            return self._content(self._ws_before_call + OPEN + body + CLOSE)
        index, self.num_calls = self.num_calls, self.num_calls + 1
        args = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        return [CallStart(index, call["name"]), ArgsDelta(index, args)]

    def _stream_call(self) -> list[Event] | None:
        events: list[Event] = []
        if self._args_from is None:
            head = _HEAD.match(self._buf)
            if head is None:
                return None
            self._args_from = head.end()
            events.append(CallStart(self.num_calls, json.loads(f'"{head.group(1)}"')))
            self.num_calls += 1
        if not self._args_done:
            end = _value_end(self._buf, self._args_from)
            upto = len(self._buf) if end is None else end
            if upto > self._args_from + self._args_sent:
                events.append(ArgsDelta(self.num_calls - 1,
                                        self._buf[self._args_from + self._args_sent:upto]))
                self._args_sent = upto - self._args_from
            self._args_done = end is not None
        close = self._buf.find(CLOSE, self._args_from + self._args_sent) if self._args_done else -1
        if close >= 0:
            self._buf, self._inside, self._after_call = self._buf[close + len(CLOSE):], False, True
            return events
        return events or None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _value_end(text: str, start: int) -> int | None:
    """End of the JSON object or array starting at ``text[start]``, None if still open."""
    depth, in_str, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
