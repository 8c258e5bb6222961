"""``twinserve compare``: run v0 and v1 side by side and write results.json, report.md, plots.

    twinserve compare --quick --out /tmp/cmp           # smoke run, tiny model, about a minute
    twinserve compare --out /tmp/cmp                    # both model settings, a few minutes
    twinserve compare --models default --concurrency 1 16 64 --repeats 3 --out /tmp/cmp
    twinserve compare --url http://127.0.0.1:8000 --out /tmp/other   # any OpenAI server
    twinserve compare --workload W1 --out /tmp/w1        # PERF.md's W1 on v0 and v1
    twinserve compare --workload W1 --url http://127.0.0.1:8080 --out /tmp/w1-peer
    twinserve compare --workload long --out /tmp/long     # long prompts among 16 streams
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from compare.config import WORKLOADS, CompareConfig, apply_workload, quick_config
from shared.config import QUANTIZATION_MODES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twinserve compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="results folder")
    p.add_argument("--quick", action="store_true", help="smoke preset (tiny model, 1 repeat, ~32 requests)")
    p.add_argument("--workload", choices=(*WORKLOADS, "long"),
                   help="a named workload of PERF.md (W1: 64 requests at c=16, 128/128 tokens; W2: 8 "
                        "at c=1, 128/128; W3: 128 at c=64, 64/64; long: 16 streams of 128/256 with "
                        "a 1,024-token prompt every 5 s, see compare/bench_long.py), streaming "
                        "chat, default model")
    p.add_argument("--models", choices=("tiny", "default", "both"), help="model setting (default: both)")
    p.add_argument("--model-path", help="folder or GGUF for the 'default' setting (default: SmolLM2-135M)")
    p.add_argument("--concurrency", type=int, nargs="+", dest="concurrencies", help="sweep (default: 1 4 16 64)")
    p.add_argument("--num-prompts", type=int, help="requests per sweep point (default: max(8, 2*concurrency))")
    p.add_argument("--input-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="prompt tokens (default: 64 128)")
    p.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="output tokens (default: 32 32)")
    p.add_argument("--request-rate", type=float, help="open-loop workload's req/s (default: 4; 0: none)")
    p.add_argument("--rate-num-prompts", type=int, help="requests of the open-loop workload (default: 32)")
    p.add_argument("--burstiness", type=float, help="gamma shape of inter-arrivals (1: Poisson)")
    p.add_argument("--repeats", type=int, help="server runs per engine, alternating v0, v1 (default: 2)")
    p.add_argument("--warmup-requests", type=int, help="uncounted requests per server start (default: 4)")
    p.add_argument("--seed", type=int)
    p.add_argument("--endpoint", choices=("completions", "chat"), help="completions sends token-id prompts")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--kv-cache-size", type=float, dest="kv_cache_size_gb", help="GiB, both engines")
    p.add_argument("--num-threads", type=int, help="torch threads of each server (default: the servers' own)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--quantization", choices=QUANTIZATION_MODES,
                   help="linear-layer weight format of both engines (default: the servers' own)")
    p.add_argument("--engines", nargs="+", choices=("v0", "v1"), help="servers to run (default: v0 v1)")
    p.add_argument("--data-parallel-size", type=int,
                   help="also run v1 with this --data-parallel-size (as engine 'v1-dpN'), beside DP=1")
    p.add_argument("--tensor-parallel-size", type=int,
                   help="also run v1 with this --tensor-parallel-size (as engine 'v1-tpN'), beside TP=1")
    p.add_argument("--url", help="drive this running OpenAI-compatible server instead of starting engines")
    p.add_argument("--tokenizer", help="folder with tokenizer.json for --url prompts (default: SmolLM2's)")
    p.add_argument("--api-key")
    p.add_argument("--health-timeout", type=float, dest="health_timeout_s")
    p.add_argument("--request-timeout", type=float, dest="request_timeout_s")
    p.add_argument("--no-plots", action="store_false", dest="plots", default=None)
    p.add_argument("--no-progress", action="store_false", dest="progress", default=None)
    return p


def config_from_args(ns: argparse.Namespace) -> CompareConfig:
    """Flags override the preset (quick or default); only flags given are applied."""
    cfg = quick_config(ns.out) if ns.quick else CompareConfig(out=ns.out)
    cfg.url = ns.url
    if ns.workload:
        apply_workload(cfg, ns.workload)
    given = {f.name: getattr(ns, f.name) for f in fields(CompareConfig)
             if f.name != "out" and getattr(ns, f.name, None) is not None}
    if "models" in given:
        given["models"] = ["tiny", "default"] if given["models"] == "both" else [given["models"]]
    if "engines" in given:
        given["engines"] = tuple(given["engines"])
    for key in ("input_len", "output_len"):
        if key in given:
            given[key] = tuple(given[key])
    if given.get("request_rate") == 0:
        given["request_rate"] = None
    for k, v in given.items():
        setattr(cfg, k, v)
    cfg.__post_init__()  # re-validate after the overrides
    return cfg


def run(cfg: CompareConfig) -> dict[str, object]:
    from compare.aggregate import build_results
    from compare.machine import describe_machine
    from compare.report import write_report
    from compare.runner import Runner

    cfg.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(cfg)
    records = runner.run()
    results = build_results(records, cfg.describe(), describe_machine(), runner.model_paths)
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    plots: list[str] = []
    if cfg.plots:
        from compare.plots import write_plots

        plots = write_plots(results, records, cfg.out)
    write_report(results, cfg.out, plots)
    return results


def run_long(ns: argparse.Namespace) -> None:
    """``--workload long``: its own two-phase run (compare/bench_long.py), same server flags."""
    from compare import bench_long
    from compare.server_proc import ServerSettings
    from shared.worker.model_fetch import resolve_model

    given = {k: getattr(ns, k) for k in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_size_gb",
                                         "num_threads", "dtype", "quantization")
             if getattr(ns, k) is not None}
    settings = ServerSettings(str(resolve_model(ns.model_path)), **given)
    bench_long.run(ns.out, list(ns.engines or ("v0", "v1")), ns.url, ns.api_key, settings)
    print((ns.out / "long.md").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        if ns.workload == "long":
            run_long(ns)
            print(f"wrote {ns.out / 'long.json'}, {ns.out / 'long.md'}", file=sys.stderr)
            return 0
        cfg = config_from_args(ns)
        run(cfg)
    except (ValueError, RuntimeError, TimeoutError) as e:
        print(f"twinserve compare: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {cfg.out / 'results.json'}, {cfg.out / 'report.md'}", file=sys.stderr)
    return 0
