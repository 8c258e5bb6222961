"""The stages of ``gpu_check.py``, each run in its own process; each returns a result dict.

    kernels    tests/kernels natively on CUDA (TRITON_INTERPRET=0); two files interpreted on the dry run
    models     random-weight folders: SmolLM2-135M's shape and a ~0.6B Llama shape
    agreement  greedy tokens: torch vs Triton backend, CUDA graphs on vs off (float32)
    offline    LLM.generate tokens/s at batch 1, 32, 256 (Triton + graphs, and torch eager)
    serving    each engine (v0, v1) at concurrency 64 through ``python -m compare --url``
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Result = dict[str, Any]
STAGES: dict[str, Callable[[argparse.Namespace], int]] = {}

# SmolLM2-135M's own shape, and a Llama/Qwen-like ~0.6B shape for throughput (vocab: SmolLM2's).
SHAPES = {"small": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                    "num_key_value_heads": 3, "intermediate_size": 1536, "head_dim": 64},
          "large": {"hidden_size": 1280, "num_hidden_layers": 24, "num_attention_heads": 20,
                    "num_key_value_heads": 4, "intermediate_size": 5120, "head_dim": 64}}
DRY_SHAPES = {"small": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "intermediate_size": 128, "head_dim": 16},
              "large": {"hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 6,
                        "num_key_value_heads": 2, "intermediate_size": 192, "head_dim": 16}}


def stage(fn: Callable[[argparse.Namespace], Result]) -> Callable[[argparse.Namespace], Result]:
    """Register ``stage_NAME``; its runner writes the result (or the error) to --stage-json."""
    def run(args: argparse.Namespace) -> int:
        try:
            result = fn(args)
        except Exception as e:  # noqa: BLE001 - a stage reports its failure, the run goes on
            result = {"ok": False, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-3000:]}
        Path(args.stage_json).write_text(json.dumps(result, indent=1), encoding="utf-8")
        return 0 if result.get("ok") else 1
    STAGES[fn.__name__.removeprefix("stage_")] = run
    return fn


def device(args: argparse.Namespace) -> str:
    return "cpu" if args.cpu_dry_run else "cuda"


def model_folder(args: argparse.Namespace, role: str) -> Path:
    """The random-weight model of this role, written on first use (fixed seed 0)."""
    import shutil

    from compare.tiny_model import TOKENIZER_FILES, tiny_config, write_random_weights

    if args.tokenizer is None:
        raise RuntimeError("no tokenizer files: run `python scripts/gpu_check.py --stage-tokenizer` "
                           "where the default model is cached, or pass --tokenizer DIR")
    shape = (DRY_SHAPES if args.cpu_dry_run else SHAPES)[role]
    folder = Path(args.workdir) / f"{role}-{shape['hidden_size']}x{shape['num_hidden_layers']}-s0"
    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    real = json.loads((Path(args.tokenizer) / "config.json").read_text(encoding="utf-8"))
    config = tiny_config(real) | shape | {"_model_name_or_path": f"twinserve random {role} (seed 0)"}
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    write_random_weights(folder / "model.safetensors", config, seed=0)
    for name in TOKENIZER_FILES:
        if (Path(args.tokenizer) / name).exists():
            shutil.copy2(Path(args.tokenizer) / name, folder / name)
    (folder / "done").touch()
    return folder


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab, size=int(k)).tolist() for k in rng.integers(lo, hi + 1, size=n)]


def make_llm(folder: Path, args: argparse.Namespace, backend: str, eager: bool, dtype: str,
             max_num_seqs: int, num_blocks: int | None, max_tokens: int = 2048) -> Any:
    """An offline LLM on this stage's device; the config is set where LLM builds its core."""
    from shared.engine_core import EngineCore
    from shared.llm import LLM

    def core_factory(config: Any, path: Path) -> EngineCore:
        config.model.device = device(args)
        config.model.attention_backend = backend
        config.model.enforce_eager = eager
        return EngineCore(config, path)

    return LLM(str(folder), dtype=dtype, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
               max_num_batched_tokens=max_tokens, core_factory=core_factory)


def release(llm: Any) -> None:
    import torch

    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@stage
def stage_kernels(args: argparse.Namespace) -> Result:
    env = os.environ | {"TRITON_INTERPRET": "1" if args.cpu_dry_run else "0"}
    # The dry run checks this stage's plumbing on two quick files: the suite itself already
    # runs all of tests/kernels under the interpreter.
    tests = ["tests/kernels/test_store_kv.py", "tests/kernels/test_rms_norm.py"] \
        if args.cpu_dry_run else ["tests/kernels"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-rs",
                           "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", proc.stdout)}
    return {"ok": proc.returncode == 0 and counts.get("passed", 0) > 0, "native_cuda": not args.cpu_dry_run,
            "counts": counts, "summary": proc.stdout.strip().splitlines()[-12:]}


@stage
def stage_models(args: argparse.Namespace) -> Result:
    import math

    from safetensors import safe_open

    out = {}
    for role in SHAPES:
        folder = model_folder(args, role)
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        out[role] = {"path": str(folder), "params_millions": round(params / 1e6, 1)}
    return {"ok": True, "models": out}


def compare_tokens(a: list[list[int]], b: list[list[int]]) -> Result:
    def common(x: list[int], y: list[int]) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))

    same = sum(x == y for x, y in zip(a, b))
    return {"identical_sequences": same, "of": len(a),
            "mean_common_prefix": sum(common(x, y) for x, y in zip(a, b)) / max(1, len(a))}


def greedy_tokens(folder: Path, args: argparse.Namespace, backend: str, eager: bool, dtype: str,
                  ps: list[list[int]], max_tokens: int) -> list[list[int]]:
    from shared.messages import SamplingParams

    llm = make_llm(folder, args, backend, eager, dtype, len(ps), num_blocks=1024)
    # Staggered lengths: the decode batch shrinks, so graphs replay padded batches (7 -> 8, 3 -> 4).
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens - i * max_tokens // (2 * len(ps)),
                             ignore_eos=True) for i in range(len(ps))]
    outs = llm.generate(ps, params)
    release(llm)
    return [o.outputs[0].token_ids for o in outs]


@stage
def stage_agreement(args: argparse.Namespace) -> Result:
    if args.cpu_dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")      # before anything imports triton
    folder = model_folder(args, "small")
    dry = args.cpu_dry_run
    ps = prompts(3 if dry else 8, 5 if dry else 16, 12 if dry else 96, 49152, seed=1)
    max_tokens = 6 if dry else 48
    variants = [("torch", True), ("triton", True)] + ([] if dry else [("triton", False)])
    toks = {f"{b}-{'eager' if e else 'graphs'}": greedy_tokens(folder, args, b, e, "float32", ps, max_tokens)
            for b, e in variants}
    pairs = {"torch_vs_triton_fp32": compare_tokens(toks["torch-eager"], toks["triton-eager"])}
    if not dry:
        pairs["graphs_vs_eager_fp32"] = compare_tokens(toks["triton-eager"], toks["triton-graphs"])
        # bf16 (the CUDA default): informational, near-ties of random weights flip in bf16.
        pairs["torch_eager_vs_triton_graphs_bf16"] = compare_tokens(
            greedy_tokens(folder, args, "torch", True, "bfloat16", ps, max_tokens),
            greedy_tokens(folder, args, "triton", False, "bfloat16", ps, max_tokens))
    checked = [v for k, v in pairs.items() if k.endswith("fp32")]
    ok = all(v["identical_sequences"] >= 0.75 * v["of"] for v in checked)
    return {"ok": ok, "criterion": ">= 75% of fp32 greedy sequences identical", "prompts": len(ps),
            "max_tokens": max_tokens, "pairs": pairs}


def throughput(llm: Any, ps: list[list[int]], out_len: int) -> float:
    from shared.messages import SamplingParams

    t0 = time.perf_counter()
    outs = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True))
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)


@stage
def stage_offline(args: argparse.Namespace) -> Result:
    from shared.messages import SamplingParams

    dry = args.cpu_dry_run
    folder = model_folder(args, "large")
    batches, in_len, out_len = ((1, 4, 8), 16, 8) if dry else ((1, 32, 256), 128, 128)
    variants = {"torch_eager": ("torch", True)} if dry else {
        "triton_graphs": ("auto", False), "torch_eager": ("torch", True)}
    num_blocks = max(batches) * -(-(in_len + out_len) // 16) + 64
    rows: dict[str, dict[str, float]] = {}
    for name, (backend, eager) in variants.items():
        llm = make_llm(folder, args, backend, eager, "bfloat16", max(batches), num_blocks,
                       max_tokens=256 if dry else 4096)
        llm.generate(prompts(4, in_len, in_len, 49152, 9), SamplingParams(temperature=0.0, max_tokens=4))
        rows[name] = {f"batch_{b}": round(throughput(llm, prompts(b, in_len, in_len, 49152, b), out_len), 1)
                      for b in batches}
        release(llm)
    return {"ok": True, "unit": "output tokens/s (prefill included), bf16, greedy, ignore_eos",
            "model": str(folder), "input_len": in_len, "output_len": out_len, "results": rows}


@stage
def stage_serving(args: argparse.Namespace) -> Result:
    from compare.server_proc import ServerProcess, ServerSettings

    @dataclass(frozen=True)
    class Settings(ServerSettings):
        extra: tuple[str, ...] = ()

        def flags(self) -> list[str]:
            return super().flags() + list(self.extra)

    dry = args.cpu_dry_run
    folder = model_folder(args, "small")
    extra = ("--device", "cuda", "--gpu-memory-utilization", "0.4")
    if dry:   # the flags' path into both engines, with the Triton backend interpreted on CPU
        os.environ["TRITON_INTERPRET"] = "1"
        extra = ("--attention-backend", "triton")
    settings = Settings(str(folder), max_num_seqs=64, max_num_batched_tokens=2048, extra=extra)
    conc, n, in_len, out_len = ((2, 4, ("8", "16"), ("4", "4")) if dry
                                else (64, 192, ("64", "128"), ("64", "64")))
    engines = {}
    for engine in ("v0", "v1"):
        out_dir = Path(args.workdir) / f"serve-{engine}"
        with ServerProcess(engine, settings, out_dir / "server.log") as server:
            server.start(health_timeout_s=150)
            subprocess.run([sys.executable, "-m", "compare", "--url", server.base_url, "--tokenizer",
                            str(folder), "--out", str(out_dir), "--concurrency", str(conc),
                            "--num-prompts", str(n), "--request-rate", "0", "--repeats", "1",
                            "--warmup-requests", str(conc), "--input-len", *in_len, "--output-len", *out_len,
                            "--no-plots", "--no-progress"], cwd=REPO, check=True, timeout=120,
                           capture_output=True)
        results = json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
        client = results["models"]["url"]["workloads"][f"c{conc}"]["engines"]["url"]["client"]
        engines[engine] = {k: v for k, v in client.items()
                           if k in ("completed", "failed", "output_throughput", "request_throughput",
                                    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")}
    ok = all(e.get("failed") == 0 and e.get("completed") == n for e in engines.values())
    return {"ok": ok, "model": str(folder), "concurrency": conc, "num_prompts": n,
            "unit": "output_throughput: tokens/s", "engines": engines}
