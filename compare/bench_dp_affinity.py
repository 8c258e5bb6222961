"""Does prefix affinity pay under data parallel? The same shared-prefix workload against two
``--data-parallel-size`` servers, affinity on and off (``--no-data-parallel-prefix-affinity``):
prefix-cache hit tokens (summed over the cores' /debug/stats) and streaming TTFT.

    python -m compare.bench_dp_affinity --data-parallel-size 2 --out /tmp/affinity.json

Workload: ``docs`` token-id "documents" of ``doc_len`` tokens, each asked ``questions`` times
(a short distinct tail), in rounds (every document once per round), at ``concurrency``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import httpx

from compare.server_proc import ServerProcess, ServerSettings
from shared.worker.model_fetch import resolve_model


def build_prompts(docs: int, doc_len: int, questions: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    bodies = [[rng.randrange(1000, 40000) for _ in range(doc_len)] for _ in range(docs)]
    return [body + [rng.randrange(1000, 40000) for _ in range(16)]
            for _ in range(questions) for body in bodies]   # round by round


async def _ttft(client: httpx.AsyncClient, model: str, prompt: list[int]) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
    t0, ttft = time.perf_counter(), None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():       # read to the end: the request completes
            if ttft is None and line.startswith("data: {") and '"text":""' not in line:
                ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError("stream ended without a token")
    return ttft


async def _drive(base_url: str, prompts: list[list[int]], concurrency: int) -> list[float]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def one(p: list[int]) -> float:
            async with sem:
                return await _ttft(client, model, p)
        return list(await asyncio.gather(*(one(p) for p in prompts)))


def measure(affinity: bool, dp: int, prompts: list[list[int]], concurrency: int,
            log: Path) -> dict[str, float]:
    settings = ServerSettings(str(resolve_model(None)), kv_cache_size_gb=0.5)
    label = f"v1-dp{dp}"
    with ServerProcess(label, settings, log) as server:
        if not affinity:
            server.flags.append("--no-data-parallel-prefix-affinity")
        server.start(180)
        ttfts = asyncio.run(_drive(server.base_url, prompts, concurrency))
        stats = httpx.get(server.base_url + "/debug/stats", timeout=10).json()
    queried = sum(e["prefix_cache_queries"] for e in stats["engines"])
    hits = sum(e["prefix_cache_hits"] for e in stats["engines"])
    return {"affinity": affinity, "requests": len(prompts), "prefix_cache_hit_tokens": hits,
            "prefix_cache_hit_rate": hits / queried if queried else 0.0,
            "ttft_mean_ms": 1000 * statistics.mean(ttfts),
            "ttft_p50_ms": 1000 * statistics.median(ttfts),
            "per_core_requests_seen": [e["prefix_cache_queries"] for e in stats["engines"]],
            "affinity_routed": stats["data_parallel"]["affinity_routed"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-parallel-size", type=int, default=2)
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--doc-len", type=int, default=256)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args(argv)
    prompts = build_prompts(ns.docs, ns.doc_len, ns.questions)
    rows = [measure(aff, ns.data_parallel_size, prompts, ns.concurrency,
                    ns.out.with_suffix(f".{'on' if aff else 'off'}.log")) for aff in (False, True)]
    ns.out.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    print("| affinity | hit tokens | hit rate | TTFT mean ms | TTFT p50 ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['affinity'] else 'off'} | {r['prefix_cache_hit_tokens']} | "
              f"{r['prefix_cache_hit_rate']:.2f} | {r['ttft_mean_ms']:.0f} | {r['ttft_p50_ms']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
