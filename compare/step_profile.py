"""Where a decode step's time goes: the engine's phases, decode.c's stages and the lm_head.

    python -m compare.step_profile [--batch 1] [--prompt-len 128] [--max-tokens 128] [--json F]

Runs ``LLM.generate`` offline at a fixed batch (``max_num_seqs`` = the batch, every sequence
decoding together) with the native kernels built once more with ``-DTWINSERVE_STAGE_TIMES``
(the same code plus decode.c's stage timers, cached beside the normal build). Per decode step
it reports the medians of the engine's phases (schedule to update), of the time of each
stage of the fused step as its thread 0 saw it (barrier waits included), and the lm_head
(``compute_logits``, its own C call). GEMM time is the four GEMM stages plus the lm_head;
everything else in the step is the rest (norms, RoPE, the KV write, attention, SiLU, the
OpenMP fork and join, input preparation, sampling, scheduling): the single-stream issue's
bounds are rest <= 1.5 ms and step <= 2x GEMM at batch 1.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from shared.llm import LLM
from shared.messages import EngineCoreOutputs, SamplingParams
from shared.worker.model_fetch import cache_dir
from shared.worker.native.abi import GEMM_STAGES, STAGES
from shared.worker.native.build import STAGE_TIMES_FLAG, NativeKernels, build, isa_flags

PHASES = ("schedule", "prepare", "forward", "sample", "update")


@dataclass
class StepProfile:
    """Milliseconds per decode step, each the median over the steps (rest: of each step's own
    step - GEMM, so one slow step does not move GEMM and step apart)."""

    batch: int
    steps: int
    phases: dict[str, float]
    stages: dict[str, float]
    lm_head: float
    step: float
    gemm: float
    rest: float
    isa: str


def summarise(batch: int, records: list[dict[str, float]], isa: str) -> StepProfile:
    """``records``: one per decode step, seconds by phase, stage and ``lm_head``."""
    def med(key: str) -> float:
        return 1e3 * statistics.median(r[key] for r in records)

    for r in records:
        r["step"] = sum(r[p] for p in PHASES)
        r["gemm"] = sum(r[s] for s in GEMM_STAGES) + r["lm_head"]
        r["rest"] = r["step"] - r["gemm"]
    return StepProfile(batch, len(records), {p: med(p) for p in PHASES}, {s: med(s) for s in STAGES},
                       med("lm_head"), med("step"), med("gemm"), med("rest"), isa)


def timed_kernels() -> NativeKernels:
    """The native library with decode.c's stage timers (built on first use, then cached)."""
    return NativeKernels(build(cache_dir() / "native", isa_flags() + [STAGE_TIMES_FLAG]))


def profile(llm: LLM, batch: int, prompt_len: int, max_tokens: int, seed: int = 0) -> StepProfile:
    """Decode ``batch`` random prompts of ``prompt_len`` tokens for ``max_tokens`` tokens each."""
    runner = llm.core.model_runner
    if runner.fused is None:
        raise SystemExit("no fused native step on this setup (see the server's start-up log)")
    kernels = timed_kernels()
    runner.fused.native = kernels       # the same kernels and weights, now with timers
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1000, 20000, prompt_len).tolist() for _ in range(batch)]
    llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    records: list[dict[str, float]] = []
    pending, step, compute_logits = [0.0], llm.core.step, runner.model.compute_logits

    def timed_logits(hidden: torch.Tensor) -> torch.Tensor:
        t = time.perf_counter()
        out = compute_logits(hidden)
        pending[0] += time.perf_counter() - t
        return out

    def timed_step() -> EngineCoreOutputs:
        kernels.stage_times()       # drop what an earlier step left
        pending[0] = 0.0
        out = step()
        times = kernels.stage_times()
        if (out.step is not None and times is not None and times[1] == 1
                and out.step.num_tokens == batch == out.step.num_seqs):
            records.append({**{p: getattr(out.step, p) for p in PHASES}, **times[0],
                            "lm_head": pending[0]})
        return out

    llm.core.step, runner.model.compute_logits = timed_step, timed_logits
    try:
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    finally:
        llm.core.step, runner.model.compute_logits = step, compute_logits
    if not records:
        raise SystemExit("no fused decode step ran at that batch")
    return summarise(batch, records, kernels.isa)


def render(p: StepProfile) -> str:
    lines = [f"decode steps at batch {p.batch}: {p.steps} (native ISA {p.isa}); ms per step",
             "| part | ms |", "|---|---|"]
    lines += [f"| {name} (phase, median) | {ms:.3f} |" for name, ms in p.phases.items()]
    lines += [f"| decode.c {name} | {ms:.3f} |" for name, ms in p.stages.items()]
    lines += [f"| lm_head (compute_logits) | {p.lm_head:.3f} |",
              f"| **step** (the phases) | {p.step:.3f} |",
              f"| **GEMM** ({' + '.join(GEMM_STAGES)} + lm_head) | {p.gemm:.3f} |",
              f"| **rest** (step - GEMM) | {p.rest:.3f} |",
              f"| step / GEMM | {p.step / p.gemm:.2f}x |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the shipped model)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--json", default=None, help="also write the profile here")
    args = ap.parse_args(argv)
    llm = LLM(args.model, quantization=args.quantization, max_num_seqs=args.batch)
    try:
        p = profile(llm, args.batch, args.prompt_len, args.max_tokens)
    finally:
        llm.close()
    print(render(p))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(p), f, indent=2)


if __name__ == "__main__":
    main()
