"""``make soak``: a long mixed load on the tiny model; afterwards nothing may be left behind.

c=32 clients for ``--minutes`` (10): streaming and non-streaming chat and completions, n > 1,
stop strings, structured outputs; 30% of clients drop their connection at a random moment and
a share of requests is malformed. At the end: no request running or waiting, every KV block
free, per-request state empty in both processes, and RSS growth of the API and core processes
after warm-up under 50 MB. Prints the figures as JSON; exit 1 if a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from compare.tiny_model import ensure_tiny_model
from shared.cli.server_process import ServerProcess
from shared.worker.model_fetch import resolve_model

RSS_LIMIT_MB = 50
BAD = [b"{", b'{"messages": []}', b'{"messages": [{"role": "user"}], "max_tokens": -1}',
       b'{"prompt": "x", "n": 1000}', b'{"messages": [{"role": "tool", "content": "x"}]}',
       b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}']


def _body(rng: random.Random) -> tuple[str, dict]:
    kind = rng.randrange(5)
    chat = {"messages": [{"role": "user", "content": f"Tell me about {rng.random():.4f}"}]}
    if kind == 0:
        return "/v1/completions", {"prompt": "Once upon a time", "max_tokens": rng.randrange(1, 64),
                                   "n": rng.choice([1, 2]), "stop": [" the"]}
    if kind == 1:
        return "/v1/chat/completions", {**chat, "max_tokens": rng.randrange(1, 64),
                                        "response_format": {"type": "json_object"}}
    return "/v1/chat/completions", {**chat, "max_tokens": rng.randrange(1, 96),
                                    "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(100)}


async def _client(c: httpx.AsyncClient, rng: random.Random, deadline: float, tally: dict) -> None:
    while time.monotonic() < deadline:
        if rng.random() < 0.1:
            r = await c.post("/v1/chat/completions", content=rng.choice(BAD),
                             headers={"content-type": "application/json"})
            tally[f"bad_{r.status_code}"] = tally.get(f"bad_{r.status_code}", 0) + 1
            continue
        path, body = _body(rng)
        stream, drop = rng.random() < 0.5, rng.random() < 0.3
        try:
            async with c.stream("POST", path, json={**body, "stream": stream}) as resp:
                lines = 0
                async for _ in resp.aiter_lines():
                    lines += 1
                    if drop and rng.random() < 0.2:
                        break           # the client goes away mid-response
                key = "dropped" if drop else f"status_{resp.status_code}"
                tally[key] = tally.get(key, 0) + 1
        except httpx.HTTPError as exc:
            tally[type(exc).__name__] = tally.get(type(exc).__name__, 0) + 1


async def _load(base_url: str, seconds: float, concurrency: int, seed: int) -> dict:
    tally: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as c:
        await asyncio.gather(*(_client(c, random.Random(seed + i), deadline, tally)
                               for i in range(concurrency)))
    return tally


def _rss_mb(pids: dict) -> dict[str, float]:
    return {role: psutil.Process(pid).memory_info().rss / 2**20 for role, pid in pids.items() if pid}


def _idle_stats(base_url: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(base_url + "/debug/stats", timeout=10).json()
        idle = (stats["num_running"] == 0 and stats["num_waiting"] == 0
                and stats["num_free_blocks"] == stats["num_total_blocks"]
                and not any(stats["request_state"].values()))
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def soak(engine: str, minutes: float, concurrency: int = 32, seed: int = 0) -> dict:
    model = ensure_tiny_model(resolve_model(None))
    log = Path(tempfile.mkdtemp()) / "server.log"
    with ServerProcess(engine, ["--model", str(model), "--enable-debug-endpoints",
                                "--max-waiting-requests", "1024"], log) as srv:
        srv.start()
        warm = min(30.0, minutes * 60 / 5)
        asyncio.run(_load(srv.base_url, warm, concurrency, seed))
        pids = _idle_stats(srv.base_url)["pids"]
        before = _rss_mb(pids)
        tally = asyncio.run(_load(srv.base_url, minutes * 60 - warm, concurrency, seed + 1000))
        stats = _idle_stats(srv.base_url)
        after = _rss_mb(pids)
    growth = {role: after[role] - before[role] for role in after}
    checks = {"idle": stats["num_running"] == 0 and stats["num_waiting"] == 0,
              "kv_free": stats["num_free_blocks"] == stats["num_total_blocks"],
              "request_state_empty": not any(stats["request_state"].values()),
              "rss_growth_ok": all(g < RSS_LIMIT_MB for g in growth.values())}
    return {"engine": engine, "minutes": minutes, "concurrency": concurrency, "requests": tally,
            "rss_mb_before": before, "rss_mb_after": after, "rss_growth_mb": growth,
            "request_state": stats["request_state"], "checks": checks, "ok": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", nargs="+", default=["v0", "v1"], choices=["v0", "v1"])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args(argv)
    results = [soak(e, args.minutes, args.concurrency) for e in args.engine]
    print(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
