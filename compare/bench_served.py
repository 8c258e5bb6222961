"""Served against offline: how much of its own engine does a v1 server deliver?

    python -m compare.bench_served --out /tmp/served            # W1 on v1, default settings
    python -m compare.bench_served --engine v0 --num-threads 2 --out /tmp/served-v0

The same requests both ways: W1's prompts (64 chat prompts of 128 tokens, 128 output tokens,
``ignore_eos``, greedy), the chat template applied by the same tokenizer. Offline, in a fresh
process: ``LLM(max_num_seqs=16)`` given all 64 at once, so the scheduler keeps 16 in flight and
admits the next as one ends, a closed loop of 16. Served: a fresh server with the same dtype,
quantization, threads and ``--max-num-seqs 16``, driven by the harness at concurrency 16. Each
side is warmed first and runs alone. Reported: output tok/s both ways, the ratio (the
batched-serving issue's bound: >= 0.9 on W1) and each side's step breakdown (ms per step of
schedule, prepare, forward, sample, update), which shows where serving loses its share.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from compare.bench_serve import Target, fetch_model_name, run_workload, warm_up
from compare.config import WORKLOADS
from compare.metrics import compute_metrics
from compare.server_proc import ServerProcess, ServerSettings
from compare.server_stats import PHASES, server_figures, take_snapshot
from compare.workload import Workload, decode_prompts, ordinary_vocab, sample_requests
from shared.worker.model_fetch import resolve_model


@dataclass(frozen=True)
class Setup:
    workload: str = "W1"
    engine: str = "v1"
    dtype: str = "auto"
    quantization: str | None = None     # None: the default (auto)
    num_threads: int | None = None      # None: each side's own default
    seed: int = 0
    num_prompts: int | None = None      # None: the workload's; smaller for a smoke run
    output_len: int | None = None


def _workload(setup: Setup) -> Workload:
    n, c, prompt, output = WORKLOADS[setup.workload]
    n, output = setup.num_prompts or n, setup.output_len or output
    return Workload(setup.workload, n, (prompt, prompt), (output, output), concurrency=c,
                    seed=setup.seed)


def _prompts(setup: Setup, model: Path) -> list[str]:
    tok = str(model / "tokenizer.json")
    return decode_prompts(tok, sample_requests(_workload(setup), ordinary_vocab(tok)))


def run_offline(setup: Setup, model: str, prompts: list[str]) -> dict[str, float]:
    """In its own process: LLM over all prompts, timed after a warm-up; per-phase step times."""
    from shared.llm import LLM
    from shared.messages import EngineCoreOutputs, SamplingParams, StepTimes

    w = _workload(setup)
    llm = LLM(model, dtype=setup.dtype, quantization=setup.quantization or "auto",
              max_num_seqs=w.concurrency or 16, num_threads=setup.num_threads)
    llm.chat([[{"role": "user", "content": "Hello there"}]] * 2, SamplingParams(max_tokens=8))
    steps: list[StepTimes] = []
    step = llm.core.step

    def recorded() -> EngineCoreOutputs:     # keep each step's timings (LLM itself drops them)
        out = step()
        if out.step is not None:
            steps.append(out.step)
        return out

    llm.core.step = recorded  # type: ignore[method-assign]
    sp = SamplingParams(max_tokens=w.output_len[0], temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], sp)
    wall = time.perf_counter() - t0
    llm.close()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    figures = {"output_throughput": tokens / wall, "duration_s": wall,
               "total_output_tokens": tokens, "steps": len(steps),
               "total_input_tokens": sum(len(o.prompt_token_ids) for o in outs)}
    for phase in PHASES:    # "output" (the API side's detokenizing) is the server's alone
        if phase in StepTimes.__struct_fields__:
            figures[f"step_{phase}_ms_per_step"] = 1000 * sum(getattr(s, phase) for s in steps) / len(steps)
    figures["forward_busy"] = sum(s.forward for s in steps) / wall
    return figures


def run_served(setup: Setup, model: str, prompts: list[str], out: Path) -> dict[str, float]:
    w = _workload(setup)
    settings = ServerSettings(model, max_num_seqs=w.concurrency or 16, num_threads=setup.num_threads,
                              dtype=setup.dtype, quantization=setup.quantization)
    with ServerProcess(setup.engine, settings, out / f"{setup.engine}-server.log") as server:
        server.start(180)
        target = Target(server.base_url, asyncio.run(fetch_model_name(server.base_url)), "chat")
        asyncio.run(warm_up(target))
        before = take_snapshot(server.base_url)
        reqs = sample_requests(w, [0])      # only output_len is read: prompts are text
        results, duration = asyncio.run(run_workload(target, w, reqs, prompts))
        after = take_snapshot(server.base_url)
    figures = compute_metrics(results, duration)
    if figures["failed"]:
        raise RuntimeError(f"{figures['failed']} served requests failed: {results[0].error}")
    return figures | server_figures(before, after)


def report(setup: Setup, offline: dict, served: dict) -> str:
    title = (f"{setup.workload} on {setup.engine} (dtype {setup.dtype}, quantization "
             f"{setup.quantization or 'auto'}, threads {setup.num_threads or 'default'})")
    lines = [title, "", "| | offline | served | served/offline |", "|---|---|---|---|"]
    rows = [("output tok/s", "output_throughput"), ("wall s", "duration_s"),
            ("forward busy (share of wall)", "forward_busy")]
    rows += [(f"{p} ms/step", f"step_{p}_ms_per_step") for p in PHASES]
    for label, key in rows:
        a, b = offline.get(key), served.get(key)
        ratio = f"{b / a:.2f}x" if a and b is not None else "—"
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
    lines.append(f"| prompt tokens | {offline['total_input_tokens']} | "
                 f"{served['total_input_tokens']} | same requests: "
                 f"{offline['total_input_tokens'] == served['total_input_tokens']} |")
    return "\n".join(lines) + "\n"


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--engine", choices=("v0", "v1"), default="v1")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization")
    ap.add_argument("--num-threads", type=int)
    ap.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--num-prompts", type=int)
    ap.add_argument("--output-len", type=int)
    ns = ap.parse_args(argv)
    setup = Setup(ns.workload, ns.engine, ns.dtype, ns.quantization, ns.num_threads,
                  num_prompts=ns.num_prompts, output_len=ns.output_len)
    ns.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(ns.model)
    prompts = _prompts(setup, model)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        offline = pool.submit(run_offline, setup, str(model), prompts).result()
    served = run_served(setup, str(model), prompts, ns.out)
    text = report(setup, offline, served)
    (ns.out / "results.json").write_text(json.dumps(
        {"setup": asdict(setup), "offline": offline, "served": served}, indent=1))
    (ns.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
