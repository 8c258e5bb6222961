"""Start and stop a real twinserve server on loopback (used by the api and engine tests)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.cli.server_process import ServerProcess
from shared.worker.model_fetch import resolve_model

API_KEY = "test-key"
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
    process: ServerProcess

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=60, **kw)


def start_server(engine: str, log_path: Path, *extra: str) -> Server:
    """Small limits so tests can reach them, debug endpoints on (the suite reads /debug/stats);
    ``extra`` flags come last and win (``--no-enable-debug-endpoints`` for the default).

    The default model is fetched here first if missing (as the ``default_model_dir`` fixture
    does), so a first download never eats into the server's start timeout.
    """
    if "--model" not in extra:
        resolve_model(None)
    # A block count, not a size: the same capacity (5,760 tokens) with either KV-cache dtype
    # `auto` picks on this CPU, so the limit tests mean the same everywhere.
    flags = ["--max-num-seqs", "32", "--num-blocks", "360", "--max-waiting-requests", "64",
             "--api-key", API_KEY, "--enable-debug-endpoints",
             "--timeout-header", "2", "--timeout-body", "2", *extra]   # short, for the slow-client tests
    process = ServerProcess(engine, flags, log_path)
    process.start(_START_TIMEOUT_S)
    assert process.proc is not None
    return Server(engine, process.base_url, API_KEY, process.proc.pid, process.proc, process)


def stop_server(server: Server) -> int | None:
    """SIGTERM, then SIGKILL on timeout; returns the exit code."""
    return server.process.stop(_STOP_TIMEOUT_S)
