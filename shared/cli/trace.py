"""``twinserve trace "prompt"``: follow one chat request from curl to token.

Starts ``twinserve serve`` as a subprocess on a free loopback port (v1 really spans two
processes), streams one chat request with ``X-Twinserve-Trace``, fetches
``/debug/lifecycle/{id}`` and prints it as a table plus a Mermaid sequence diagram.
"""
from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.cli.server_process import ServerProcess
from shared.trace import render as trace_render

_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 15.0


@dataclass
class TracedServer:
    process: ServerProcess
    api_key: str

    @property
    def base_url(self) -> str:
        return self.process.base_url

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


def start(engine: str, model: str | None = None, dtype: str | None = None) -> TracedServer:
    """``twinserve serve`` on loopback with a random API key; returns once /health is ok."""
    key = secrets.token_hex(16)
    flags = ["--api-key", key, "--enable-debug-endpoints"]
    flags += ["--model", model] if model else []
    flags += ["--dtype", dtype] if dtype else []
    log_path = Path(tempfile.mkdtemp(prefix="twinserve-trace-")) / "server.log"
    process = ServerProcess(engine, flags, log_path)
    try:
        process.start(_START_TIMEOUT_S)
    except (RuntimeError, TimeoutError):
        shutil.rmtree(log_path.parent, ignore_errors=True)
        raise
    return TracedServer(process, key)


def stop(server: TracedServer) -> None:
    server.process.stop(_STOP_TIMEOUT_S)
    shutil.rmtree(server.process.log_path.parent, ignore_errors=True)
