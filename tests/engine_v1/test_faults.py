"""Fault handling: a dying or stalled engine fails requests cleanly and the server exits for a
supervisor (or stays up with --keep-alive-on-engine-death); shutdown leaves nothing behind."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from shared.api.watchdog import DEATH_GRACE_S
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
        # vLLM's policy: after a grace period of 503s the server exits non-zero for a supervisor.
        assert server.proc.wait(DEATH_GRACE_S + 10) == 1
    finally:
        stop_server(server)


@pytest.mark.parametrize("engine", ENGINES)
def test_forward_raising_kills_engine_cleanly(engine: str, tmp_path: Path) -> None:
    server = start_server(engine, tmp_path / "server.log", "--debug-fail-after-steps", "3",
                          "--keep-alive-on-engine-death")
    try:
        with server.client() as c:
            resp = c.post(CHAT, json={"messages": HELLO, "max_tokens": 20, "ignore_eos": True})
            assert resp.status_code >= 500
            assert "error" in resp.json()
            _wait_health(server, 503, timeout=5)
            if engine == "v1":      # with the flag it stays up past the grace period
                time.sleep(DEATH_GRACE_S + 1)
            assert_error(c.post(CHAT, json={"messages": HELLO, "max_tokens": 4}), 503)
    finally:
        assert stop_server(server) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stalled_engine_is_declared_dead(engine: str, tmp_path: Path) -> None:
    """v1: the core is SIGSTOPped; v0: the forward pass hangs (test hook). Either way the
    watchdog fails the stream, /health turns 503, and the server exits 1 after the grace."""
    hang = ["--debug-hang-after-steps", "20"] if engine == "v0" else []
    server = start_server(engine, tmp_path / "server.log", "--engine-step-timeout", "2", *hang)
    core_pid = None
    try:
        with server.client() as c:
            core_pid = c.get("/debug/stats").json()["pids"]["core"]
        lines: list[str] = []
        reader, first = _stream_in_background(server, lines)
        assert first.wait(60)
        if engine == "v1":
            os.kill(core_pid, signal.SIGSTOP)
        t0 = time.monotonic()
        _wait_health(server, 503, timeout=10)
        assert time.monotonic() - t0 < 2 + 3      # the timeout plus the watchdog's polling
        reader.join(10)
        assert not reader.is_alive()
        events = sse_data(lines)
        assert events[-1] == "[DONE]" and "no progress" in json.dumps(events[-2])
        assert server.proc.wait(DEATH_GRACE_S + 10) == 1
    finally:
        stop_server(server)
        if engine == "v1" and core_pid and psutil.pid_exists(core_pid):
            os.kill(core_pid, signal.SIGKILL)


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



def test_a_core_thread_that_dies_takes_the_core_down_loudly(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    """The core's input and output threads run under _loud: an exception escaping one exits
    the process (the API process then sees the core gone and fails its requests)."""
    from engine_v1 import core_proc

    exits: list[int] = []
    monkeypatch.setattr(core_proc.os, "_exit", exits.append)

    def broken() -> None:
        raise ValueError("undecodable frame")

    core_proc._loud(broken)()
    assert exits == [1] and "undecodable frame" in capsys.readouterr().err
    core_proc._loud(lambda: None)()
    assert exits == [1]                 # a thread that ends normally exits nothing
