"""Start and stop a real twinserve server on loopback (used by the api and engine tests)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "test-key"
REPO = Path(__file__).resolve().parents[1]
ENGINES = ["v0", "v1"]
_START_TIMEOUT_S = 120
_STOP_TIMEOUT_S = 15


@dataclass
class Server:
    engine: str
    base_url: str
    api_key: str
    pid: int
    proc: subprocess.Popen

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(engine: str, log_path: Path, *extra: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "shared.cli", "serve", "--engine", engine, "--port", str(port),
           "--max-num-seqs", "32", "--kv-cache-size", "0.25", "--max-waiting-requests", "64",
           "--api-key", API_KEY, *extra]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = Server(engine, f"http://127.0.0.1:{port}", API_KEY, proc.pid, proc)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_server(server)
    raise RuntimeError(f"server not healthy after {_START_TIMEOUT_S}s: {log_path.read_text()[-3000:]}")


def stop_server(server: Server) -> int | None:
    """SIGTERM, then SIGKILL on timeout; returns the exit code (None if it had to be killed)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        return None


