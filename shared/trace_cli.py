"""``twinserve trace "prompt"``: follow one chat request from curl to token.

Starts ``twinserve serve`` as a subprocess on a free loopback port (v1 really spans two
processes), streams one chat request with ``X-Twinserve-Trace``, fetches
``/debug/lifecycle/{id}`` and prints it as a table plus a Mermaid sequence diagram.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared import trace_render

_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 15.0


@dataclass
class TracedServer:
    proc: subprocess.Popen
    base_url: str
    api_key: str
    log_path: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the user message to send")
    parser.add_argument("--engine", choices=("v0", "v1"), default="v1")
    parser.add_argument("--model", default=None, help="HF folder or GGUF file (default: SmolLM2-135M)")
    parser.add_argument("--dtype", default=None, help="auto | float32 | bfloat16")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--all-steps", action="store_true",
                        help="keep every decode step instead of one summary")
    parser.add_argument("--json", action="store_true", help="print the events as JSON")
    parser.add_argument("--chrome-trace", metavar="FILE", default=None,
                        help="also write every traced request in Chrome trace format (Perfetto)")


def cmd_trace(ns: argparse.Namespace) -> int:
    server = start(ns.engine, ns.model, ns.dtype)
    try:
        trace = traced_chat(server, ns.prompt, ns.max_tokens, "all" if ns.all_steps else "1")
        if ns.chrome_trace:
            everything = fetch(server, "/debug/lifecycle")["traces"]
            Path(ns.chrome_trace).write_text(json.dumps(trace_render.chrome_trace(everything)))
    finally:
        stop(server)
    if ns.json:
        keys = ("step", "name", "t_ms", "pid", "process", "thread", "where", "request_id", "detail")
        events = [{k: e[k] for k in keys if k in e} for e in trace["events"]]
        print(json.dumps({"request_id": trace["request_id"], "engine": trace["engine"],
                          "events": events}, indent=1))
    else:
        print(trace_render.table(trace))
        print("\n```mermaid\n" + trace_render.mermaid(trace) + "\n```")
    if ns.chrome_trace:
        print(f"twinserve trace: wrote {ns.chrome_trace}", file=sys.stderr)
    return 0


def traced_chat(server: TracedServer, prompt: str, max_tokens: int, mode: str = "1") -> dict:
    """Stream one traced chat request; return its lifecycle from /debug/lifecycle/{id}."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    headers = {**server.headers, "X-Twinserve-Trace": mode}
    request_id = None
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      headers=headers, timeout=120) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"chat request failed: {resp.status_code} {resp.read().decode()}")
        for line in resp.iter_lines():
            if line.startswith("data: {") and request_id is None:
                request_id = json.loads(line[6:])["id"]
    if request_id is None:
        raise RuntimeError("the server streamed no chunk with an id")
    return fetch(server, f"/debug/lifecycle/{request_id}")


def fetch(server: TracedServer, path: str) -> dict:
    resp = httpx.get(f"{server.base_url}{path}", headers=server.headers, timeout=30)
    resp.raise_for_status()
    return resp.json()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(engine: str, model: str | None = None, dtype: str | None = None) -> TracedServer:
    """``twinserve serve`` on loopback with a random API key; returns once /health is ok."""
    port, key = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "shared.cli", "serve", "--engine", engine, "--host", "127.0.0.1",
           "--port", str(port), "--api-key", key]
    cmd += ["--model", model] if model else []
    cmd += ["--dtype", dtype] if dtype else []
    log_path = Path(tempfile.mkdtemp(prefix="twinserve-trace-")) / "server.log"
    repo = Path(__file__).resolve().parents[1]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = TracedServer(proc, f"http://127.0.0.1:{port}", key, log_path)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {_tail(log_path)}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(server)
    raise RuntimeError(f"the server was not healthy within {_START_TIMEOUT_S:.0f} s: {_tail(log_path)}")


def stop(server: TracedServer) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    shutil.rmtree(server.log_path.parent, ignore_errors=True)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]
