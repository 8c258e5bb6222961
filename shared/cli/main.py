"""``twinserve``: serve, fetch-model, generate, trace. The one place that picks an engine."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from shared.cli.args import add_dataclass_args, build_dataclass
from shared.cli.trace import add_trace_args, cmd_trace
from shared.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    ServerConfig,
    StructuredOutputsConfig,
)

_ENGINE_DATACLASSES = (ModelConfig, CacheConfig, SchedulerConfig, StructuredOutputsConfig,
                       ParallelConfig)


def _engine_config(ns: argparse.Namespace) -> EngineConfig:
    model, cache, sched, structured, parallel = (build_dataclass(c, ns) for c in _ENGINE_DATACLASSES)
    return EngineConfig(model=model, cache=cache, scheduler=sched, structured_outputs=structured,
                        parallel=parallel)


def cmd_serve(ns: argparse.Namespace) -> int:
    engine_config = _engine_config(ns)
    server_config = build_dataclass(ServerConfig, ns)
    par = engine_config.parallel
    if par.data_parallel_size > 1 and par.tensor_parallel_size > 1:
        raise SystemExit("--data-parallel-size and --tensor-parallel-size cannot both be > 1 yet")
    if par.data_parallel_size > 1 and server_config.engine != "v1":
        raise SystemExit("--data-parallel-size > 1 needs --engine v1 (v0 runs one engine core "
                         "inside the API process)")
    if server_config.api_key is None:
        server_config.api_key = os.environ.get("TWINSERVE_API_KEY") or None
    return asyncio.run(_serve(engine_config, server_config))


async def _serve(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    from shared.api.server import run_server

    if server_config.engine == "v0":
        from engine_v0 import AsyncEngine

        engine = AsyncEngine(engine_config, server_config.max_waiting_requests)
    else:
        from engine_v1 import AsyncLLM

        engine = AsyncLLM(engine_config, server_config.max_waiting_requests)
    code = await run_server(engine, server_config)
    if code != 0:
        # The engine died: a thread stuck in it (a hung forward) can never be joined, and
        # asyncio.run would wait for it at exit (shutdown_default_executor).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def cmd_fetch_model(ns: argparse.Namespace) -> int:
    from shared.worker.model_fetch import resolve_model

    print(resolve_model(ns.model), flush=True)
    return 0


def cmd_generate(ns: argparse.Namespace) -> int:
    from shared.llm import LLM
    from shared.messages import SamplingParams

    cfg = _engine_config(ns)
    llm = LLM(cfg.model.model, dtype=cfg.model.dtype, max_model_len=cfg.model.max_model_len,
              num_threads=cfg.model.num_threads, kv_cache_size_gb=cfg.cache.kv_cache_size_gb)
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens)
    for out in llm.chat([[{"role": "user", "content": p}] for p in ns.prompts], params):
        print(out.outputs[0].text)
    return 0


def cmd_compare(argv: list[str]) -> int:
    from compare.cli import main as compare_main

    return compare_main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twinserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    add_dataclass_args(serve, ServerConfig)
    for cls in _ENGINE_DATACLASSES:
        add_dataclass_args(serve, cls)
    serve.set_defaults(func=cmd_serve)
    fetch = sub.add_parser("fetch-model", help="fetch and convert the default model; print its folder")
    fetch.add_argument("--model", default=None)
    fetch.set_defaults(func=cmd_fetch_model)
    gen = sub.add_parser("generate", help="offline chat demo: one answer per prompt")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--max-tokens", type=int, default=64)
    for cls in _ENGINE_DATACLASSES:
        add_dataclass_args(gen, cls)
    gen.set_defaults(func=cmd_generate)
    trace = sub.add_parser("trace", help="trace one chat request from curl to token (table + diagram)")
    add_trace_args(trace)
    trace.set_defaults(func=cmd_trace)   # shared/cli/trace.py
    # `compare` parses its own flags (see compare/cli.py); listed here for --help.
    sub.add_parser("compare", help="run v0 and v1 side by side and report (twinserve compare --help)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the rest
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return cmd_compare(argv[1:])
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, RuntimeError) as e:
        print(f"twinserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
