"""``make bench-structured``: what constrained decoding costs once a grammar is compiled.

16 concurrent json_schema requests, then 16 unconstrained ones on the same prompts and seeds,
each capped at the token count its constrained twin produced (ignore_eos), so both rounds run
the same batch shapes step for step. Reported: TPOT per request (p50, mean), the engine's step
phases (GET /debug/stats), and grammar compile time (p50/p99 over distinct schemas, compiled on
this machine the way the engine core compiles them). Target: constrained TPOT <= 1.15x.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from compare.server_stats import server_figures, take_snapshot
from shared.cli.server_process import ServerProcess
from shared.messages import StructuredOutputsParams
from shared.structured.compiler import GrammarCompiler, GrammarState
from shared.worker.model_fetch import resolve_model

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "role", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "role": {"enum": ["admin", "user", "guest"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                  "minItems": 1, "maxItems": 4},
                         "address": {"type": "object", "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
TOPICS = ["a pilot", "a chef", "a student", "a doctor", "a painter", "a farmer", "a coder",
          "a singer", "a sailor", "a judge", "a baker", "a nurse", "a poet", "a miner", "a monk",
          "a clown"]


async def _one(client: httpx.AsyncClient, body: dict) -> tuple[int, float | None]:
    """(completion tokens, TPOT in s) of one streamed chat request."""
    stamps: list[float] = []
    usage = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    tpot = (stamps[-1] - stamps[0]) / (usage - 1) if usage > 1 and len(stamps) > 1 else None
    return usage, tpot


async def _round(base_url: str, bodies: list[dict]) -> list[tuple[int, float | None]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        return await asyncio.gather(*(_one(client, b) for b in bodies))


def _bodies(max_tokens: list[int] | None) -> list[dict]:
    bodies = []
    for i, topic in enumerate(TOPICS):
        body = {"messages": [{"role": "user", "content": f"Describe {topic} as a JSON profile."}],
                "temperature": 0.8, "seed": i, "stream": True,
                "stream_options": {"include_usage": True}}
        if max_tokens is None:
            body |= {"max_tokens": 256, "response_format": {
                "type": "json_schema", "json_schema": {"name": "profile", "schema": SCHEMA}}}
        else:
            body |= {"max_tokens": max_tokens[i], "ignore_eos": True}
        bodies.append(body)
    return bodies


def _measured(base_url: str, bodies: list[dict]) -> tuple[list[tuple[int, float | None]], dict]:
    before = take_snapshot(base_url)
    results = asyncio.run(_round(base_url, bodies))
    return results, server_figures(before, take_snapshot(base_url))


def compile_times(n: int) -> list[float]:
    """Seconds from submit to ready for ``n`` distinct schemas (property names differ), on the
    engine core's compiler, after a warm-up that builds its tokenizer."""
    compiler = GrammarCompiler(resolve_model(None) / "tokenizer.json", 49152, 2, cache_size=n + 1)
    _wait(compiler.submit(StructuredOutputsParams(regex="warm")))
    times = []
    for k in range(n):
        schema = json.loads(json.dumps(SCHEMA).replace('"name"', f'"name_{k}"'))
        t0 = time.perf_counter()
        _wait(compiler.submit(StructuredOutputsParams(json=json.dumps(schema))))
        times.append(time.perf_counter() - t0)
    compiler.shutdown()
    return times


def _wait(state: GrammarState) -> None:
    while not state.ready():
        time.sleep(0.0002)
    assert state.error is None, state.error


def _summary(name: str, results: list[tuple[int, float | None]], fig: dict) -> dict:
    tpots = [t for _, t in results if t is not None]
    return {"round": name, "tokens": [n for n, _ in results],
            "tpot_p50_ms": statistics.median(tpots) * 1e3, "tpot_mean_ms": statistics.fmean(tpots) * 1e3,
            "step_ms": {p: fig.get(f"step_{p}_ms_per_step") for p in ("forward", "sample", "update")},
            "steps": fig.get("steps")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="v1", choices=["v0", "v1"])
    ap.add_argument("--schemas", type=int, default=30, help="distinct schemas timed for compile")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    log = Path(tempfile.mkdtemp()) / "server.log"
    with ServerProcess(args.engine, ["--max-num-seqs", "16", "--enable-debug-endpoints"], log) as srv:
        srv.start()
        _measured(srv.base_url, _bodies(None)[:2])                      # warm-up, compiles SCHEMA
        constrained, fig_c = _measured(srv.base_url, _bodies(None))
        free, fig_f = _measured(srv.base_url, _bodies([n for n, _ in constrained]))
    times = sorted(compile_times(args.schemas))
    report = {"engine": args.engine, "constrained": _summary("json_schema", constrained, fig_c),
              "unconstrained": _summary("free", free, fig_f),
              "compile_ms": {"p50": statistics.median(times) * 1e3,
                             "p99": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3}}
    c, f = report["constrained"], report["unconstrained"]
    report["tpot_ratio_p50"] = c["tpot_p50_ms"] / f["tpot_p50_ms"]
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
