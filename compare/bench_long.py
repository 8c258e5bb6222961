"""The ``long`` workload: do long prompts stall running decodes?

    twinserve compare --workload long --out /tmp/long               # v0 and v1, fresh servers
    twinserve compare --workload long --url http://127.0.0.1:8080 --out /tmp/long-peer
    python -m compare.bench_long --engines v1 --long-prefill-token-threshold 128 --out /tmp/long

Two phases per server, streaming chat: ``streams`` decode streams (``stream_prompt`` /
``stream_output`` tokens, all in flight at once), alone; then the same load again (new
prompts, so no prefix-cache help) with one ``long_prompt``-token prompt (``long_output``
tokens) arriving every ``long_every_s`` seconds while the streams run. Reported: the streams'
ITL p50/p99 in each phase and their ratio (the issue's bound: p99 within 2x), and the long
prompts' TTFT. Each twinserve phase gets a fresh server; a ``--url`` server serves both.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import httpx
import numpy as np

from compare.bench_serve import Target, fetch_model_name, send_request, warm_up
from compare.metrics import RequestResult
from compare.server_proc import ServerProcess, ServerSettings
from compare.workload import Workload, decode_prompts, ordinary_vocab, sample_requests
from shared.worker.model_fetch import resolve_model

TargetOf = Callable[[str], AbstractContextManager[Target]]


@dataclass(frozen=True)
class LongWorkload:
    streams: int = 16
    stream_prompt: int = 128
    stream_output: int = 256
    long_prompt: int = 1024
    long_output: int = 64
    long_every_s: float = 5.0
    first_long_s: float = 2.0       # the streams are past their own prefills by then
    seed: int = 0


def _prompts(tokenizer_json: str, n: int, length: int, output: int, seed: int) -> list[str]:
    w = Workload("long", n, (length, length), (output, output), seed=seed)
    return decode_prompts(tokenizer_json, sample_requests(w, ordinary_vocab(tokenizer_json)))


async def run_phase(target: Target, wl: LongWorkload, streams: list[str],
                    longs: list[str]) -> tuple[list[RequestResult], list[RequestResult]]:
    """The streams, plus one of ``longs`` every ``long_every_s`` until the streams end."""
    limits = httpx.Limits(max_connections=wl.streams + len(longs) + 1)
    async with httpx.AsyncClient(limits=limits, timeout=target.request_timeout_s) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(send_request(client, target, p, wl.stream_output, t0))
                 for p in streams]
        sent: list[asyncio.Task[RequestResult]] = []
        for i, prompt in enumerate(longs):
            due = t0 + wl.first_long_s + i * wl.long_every_s
            done, _ = await asyncio.wait(tasks, timeout=max(0.0, due - time.perf_counter()))
            if len(done) == len(tasks):
                break                   # the streams ended: later long prompts would run alone
            sent.append(asyncio.create_task(send_request(client, target, prompt, wl.long_output, t0)))
        return list(await asyncio.gather(*tasks)), list(await asyncio.gather(*sent))


def summarize(streams: list[RequestResult], longs: list[RequestResult]) -> dict[str, object]:
    failed = [r.error for r in streams + longs if not r.success]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0]}")
    itl = np.array([x for r in streams for x in r.itl]) * 1000
    out: dict[str, object] = {"stream_itl_p50_ms": float(np.percentile(itl, 50)),
                              "stream_itl_p99_ms": float(np.percentile(itl, 99)),
                              "stream_itl_max_ms": float(itl.max()), "num_long": len(longs)}
    if longs:
        ttft = np.array([r.ttft for r in longs]) * 1000
        out |= {"long_ttft_mean_ms": float(ttft.mean()), "long_ttft_max_ms": float(ttft.max())}
    return out


def measure(target_of: TargetOf, wl: LongWorkload, tokenizer_json: str) -> dict[str, object]:
    """Both phases; ``target_of(phase)`` is a context giving that phase's Target."""
    rows: dict[str, object] = {}
    for phase, seed in (("alone", 1), ("with_long", 2)):
        streams = _prompts(tokenizer_json, wl.streams, wl.stream_prompt, wl.stream_output, wl.seed * 10 + seed)
        # More than the streams can outlast (a stream token takes well over 4 ms here).
        n_long = 0 if phase == "alone" else int(wl.stream_output * 0.2 / wl.long_every_s) + 2
        longs = _prompts(tokenizer_json, n_long, wl.long_prompt, wl.long_output, wl.seed * 10 + 3) \
            if n_long else []
        with target_of(phase) as target:
            rows[phase] = summarize(*asyncio.run(run_phase(target, wl, streams, longs)))
    alone, mixed = rows["alone"], rows["with_long"]
    rows["itl_p99_ratio"] = mixed["stream_itl_p99_ms"] / alone["stream_itl_p99_ms"]
    return rows


def fresh_servers(engine: str, settings: ServerSettings, out: Path,
                  extra: list[str]) -> TargetOf:
    """Each phase on a new twinserve server, warmed with two short requests."""
    @contextlib.contextmanager
    def target_of(phase: str) -> Iterator[Target]:
        with ServerProcess(engine, settings, out / f"{engine}-{phase}.log") as server:
            server.flags.extend(extra)
            server.start(180)
            target = Target(server.base_url, asyncio.run(fetch_model_name(server.base_url)), "chat")
            asyncio.run(warm_up(target))
            yield target
    return target_of


def one_server(url: str, api_key: str | None) -> TargetOf:
    @contextlib.contextmanager
    def target_of(phase: str) -> Iterator[Target]:
        yield Target(url, asyncio.run(fetch_model_name(url, api_key)), "chat", api_key)
    return target_of


def report(rows: dict[str, dict[str, object]]) -> str:
    head = ("| server | ITL p50 alone | ITL p99 alone | ITL p50 with long | ITL p99 with long | "
            "p99 ratio | long TTFT mean | long TTFT max | long prompts |")
    lines = [head, "|---" * 9 + "|"]
    for name, r in rows.items():
        a, m = r["alone"], r["with_long"]
        lines.append(f"| {name} | {a['stream_itl_p50_ms']:.1f} | {a['stream_itl_p99_ms']:.1f} | "
                     f"{m['stream_itl_p50_ms']:.1f} | {m['stream_itl_p99_ms']:.1f} | "
                     f"{r['itl_p99_ratio']:.2f}x | {m.get('long_ttft_mean_ms', 0):.0f} | "
                     f"{m.get('long_ttft_max_ms', 0):.0f} | {m['num_long']} |")
    return "\n".join(lines) + "\n\nTimes in ms; ITL over all 16 streams' tokens.\n"


def run(out: Path, engines: list[str], url: str | None, api_key: str | None = None,
        settings: ServerSettings | None = None, extra: list[str] | None = None,
        wl: LongWorkload | None = None) -> dict[str, object]:
    """Both phases on each engine (or on ``url``); writes long.json and long.md under ``out``."""
    wl = wl or LongWorkload()
    out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(None)
    settings = settings or ServerSettings(str(model))
    tokenizer_json = str(model / "tokenizer.json")
    targets = {"url": one_server(url, api_key)} if url else \
        {e: fresh_servers(e, settings, out, extra or []) for e in engines}
    rows = {name: measure(t, wl, tokenizer_json) for name, t in targets.items()}
    result = {"workload": asdict(wl), "server_flags": settings.flags() + (extra or []), "results": rows}
    (out / "long.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    (out / "long.md").write_text(report(rows), encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--engines", nargs="+", default=["v0", "v1"])
    p.add_argument("--url")
    p.add_argument("--api-key")
    p.add_argument("--long-prefill-token-threshold", type=int,
                   help="passed to twinserve (default: the server's own)")
    p.add_argument("--prefill-step-ratio", type=float,
                   help="passed to twinserve (default: the server's own; 0: no pacing)")
    p.add_argument("--prefill-pace-threshold", type=int,
                   help="passed to twinserve (default: the server's own; 0: pace every prompt)")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help="twinserve's per-step token budget (default: the harness's 1024)")
    for f in fields(LongWorkload):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ns = p.parse_args(argv)
    wl = LongWorkload(**{f.name: getattr(ns, f.name) for f in fields(LongWorkload)})
    extra = [] if ns.long_prefill_token_threshold is None else \
        ["--long-prefill-token-threshold", str(ns.long_prefill_token_threshold)]
    if ns.prefill_step_ratio is not None:
        extra += ["--prefill-step-ratio", str(ns.prefill_step_ratio)]
    if ns.prefill_pace_threshold is not None:
        extra += ["--prefill-pace-threshold", str(ns.prefill_pace_threshold)]
    settings = None
    if ns.max_num_batched_tokens is not None:
        settings = ServerSettings(str(resolve_model(None)), max_num_batched_tokens=ns.max_num_batched_tokens)
    result = run(ns.out, ns.engines, ns.url, ns.api_key, settings, extra, wl)
    print(report(result["results"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
