"""v1 fault handling: a dying core fails requests cleanly; shutdown leaves nothing behind."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server_util import ENGINES, Server, start_server, stop_server
from tests.shared.api.api_helpers import CHAT, HELLO, assert_error, sse_data


def _stream_in_background(server: Server, lines: list[str]) -> tuple[threading.Thread, threading.Event]:
    first = threading.Event()

    def read() -> None:
        body = {"messages": HELLO, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{server.base_url}{CHAT}", json=body, headers=server.headers,
                              timeout=30) as resp:
                for line in resp.iter_lines():
                    lines.append(line)
                    first.set()
        finally:
            first.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, first


def _wait_health(server: Server, status: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if httpx.get(f"{server.base_url}/health", timeout=2).status_code == status:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"/health did not turn {status} within {timeout}s")


def test_core_killed_fails_requests_and_health(tmp_path: Path) -> None:
    server = start_server("v1", tmp_path / "server.log")
    try:
        with server.client() as c:
            stats = c.get("/debug/stats").json()
        core_pid = stats["pids"]["core"]
        assert core_pid and core_pid != server.pid
        lines: list[str] = []
        reader, first = _stream_in_background(server, lines)
        assert first.wait(60)
        os.kill(core_pid, signal.SIGKILL)
        assert _wait_health(server, 503, timeout=5) < 2.0
        reader.join(10)
        assert not reader.is_alive()
        events = sse_data(lines)
        assert events[-1] == "[DONE]" and "error" in events[-2]
        with server.client() as c:
            assert_error(c.post(CHAT, json={"messages": HELLO, "max_tokens": 4}), 503)
    finally:
        assert stop_server(server) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_forward_raising_kills_engine_cleanly(engine: str, tmp_path: Path) -> None:
    server = start_server(engine, tmp_path / "server.log", "--debug-fail-after-steps", "3")
    try:
        with server.client() as c:
            resp = c.post(CHAT, json={"messages": HELLO, "max_tokens": 20, "ignore_eos": True})
            assert resp.status_code >= 500
            assert "error" in resp.json()
            _wait_health(server, 503, timeout=5)
            assert_error(c.post(CHAT, json={"messages": HELLO, "max_tokens": 4}), 503)
    finally:
        assert stop_server(server) == 0


def test_sigterm_stops_core_and_removes_sockets(tmp_path: Path) -> None:
    server = start_server("v1", tmp_path / "server.log")
    with server.client() as c:
        stats = c.get("/debug/stats").json()
    core_pid, ipc_dir = stats["pids"]["core"], Path(stats["ipc_dir"])
    assert psutil.pid_exists(core_pid)
    assert ipc_dir.is_dir() and (ipc_dir.stat().st_mode & 0o777) == 0o700
    assert {p.name for p in ipc_dir.iterdir()} == {"input", "output"}
    assert stop_server(server) == 0
    deadline = time.monotonic() + 5
    while psutil.pid_exists(core_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(core_pid), "the core process outlived the API server"
    assert not ipc_dir.exists()


def test_core_that_fails_to_start_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(RuntimeError, match="exited with"):
        start_server("v1", tmp_path / "server.log", "--model", str(bad))
