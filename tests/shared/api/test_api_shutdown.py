"""SIGTERM with a request in flight: the stream ends, the engine shuts down, exit code 0."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server_util import ENGINES, start_server, stop_server
from tests.shared.api.api_helpers import CHAT, HELLO, sse_data


@pytest.mark.parametrize("engine", ENGINES)
def test_sigterm_with_stream_in_flight(engine, tmp_path):
    server = start_server(engine, tmp_path / "server.log")
    lines: list[str] = []
    first_chunk = threading.Event()

    def read_stream() -> None:
        body = {"messages": HELLO, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{server.base_url}{CHAT}", json=body, headers=server.headers,
                              timeout=30) as resp:
                for line in resp.iter_lines():
                    lines.append(line)
                    first_chunk.set()
        except httpx.HTTPError:
            pass   # a cut connection is an acceptable end too
        first_chunk.set()

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    assert first_chunk.wait(30)
    t0 = time.monotonic()
    code = stop_server(server)
    log = (tmp_path / "server.log").read_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]      # a clean stop, nothing dying noisily
    assert time.monotonic() - t0 < 10
    reader.join(5)
    assert not reader.is_alive()
    events = sse_data(lines)
    assert events and events[-1] == "[DONE]" and "error" in events[-2]
