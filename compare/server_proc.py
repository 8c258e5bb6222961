"""One twinserve server as a subprocess: start, wait for /health (bounded), stop.

Stopping sends SIGTERM to the API process (which shuts its engine core down), then kills the
process group it was started in if it has not exited in time, so no core process outlives a run.
"""
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

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServerSettings:
    """What both engines get, identically."""
    model: str
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    kv_cache_size_gb: float = 0.5
    num_threads: int = 1
    dtype: str = "auto"

    def argv(self, engine: str, port: int) -> list[str]:
        return [sys.executable, "-m", "shared.cli", "serve", "--engine", engine,
                "--host", "127.0.0.1", "--port", str(port), "--model", self.model,
                "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--kv-cache-size", str(self.kv_cache_size_gb),
                "--num-threads", str(self.num_threads), "--dtype", self.dtype,
                "--max-waiting-requests", "100000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, engine: str, settings: ServerSettings, log_path: Path) -> None:
        self.engine = engine
        self.settings = settings
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, health_timeout_s: float = 180.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Own session: a kill on timeout reaches the engine core too.
            self.proc = subprocess.Popen(self.settings.argv(self.engine, self.port), cwd=REPO_ROOT,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
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
        """SIGTERM, then SIGKILL to the whole group; returns the exit code."""
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
