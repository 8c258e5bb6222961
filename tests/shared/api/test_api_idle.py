"""Idle means idle: with no requests the server's processes use (almost) no CPU."""
from __future__ import annotations

import time

import psutil

from tests.server_util import Server


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def test_idle_server_uses_no_cpu(server: Server, client) -> None:
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    pids = [p for p in client.get("/debug/stats").json()["pids"].values() if p]
    time.sleep(0.5)
    before = _cpu_seconds(pids)
    time.sleep(3.0)
    used = _cpu_seconds(pids) - before
    # A busy-spinning loop would burn ~3 s here; timers and pollers cost a few ms.
    assert used < 0.3, f"{server.engine} used {used:.2f} s of CPU in 3 s while idle"
