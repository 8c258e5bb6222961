"""``twinserve serve`` as a subprocess on loopback: start, wait for /health, stop.

Used by ``twinserve trace``, the compare harness and the tests, so there is one way to run a
server from Python. Stopping sends SIGTERM to the API process (which shuts its engine core
down), then kills the process group it was started in if anything is left, so no core
process outlives it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

_REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, engine: str, flags: list[str], log_path: Path) -> None:
        self.engine = engine
        self.flags = flags
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "shared.cli.main", "serve", "--engine", self.engine,
                "--host", "127.0.0.1", "--port", str(self.port), *self.flags]

    def start(self, health_timeout_s: float = 180.0) -> None:
        """Launch and block until /health answers 200; raise (after stopping) otherwise."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Own session: a kill on timeout reaches the engine core too.
            self.proc = subprocess.Popen(self.argv(), cwd=_REPO_ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_healthy(health_timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine} server exited with {self.proc.returncode}; "
                                   f"log: {self.log_path}\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.engine} server not healthy after {timeout_s:.0f}s; "
                           f"log: {self.log_path}\n{self.log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL to the whole group; returns the API process's exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # the group may still hold a core process even if the API process is gone
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait(timeout_s)
        self.proc = None
        return code

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
