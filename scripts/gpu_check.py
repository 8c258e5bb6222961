"""A few minutes on a lent GPU: kernel tests natively, backend / CUDA-graph agreement, throughput.

    python scripts/gpu_check.py --out results/gpu_check.json      # on the GPU machine
    python scripts/gpu_check.py --cpu-dry-run --out /tmp/dry.json  # plumbing check, tiny shapes
    python scripts/gpu_check.py --stage-tokenizer                  # before: copy tokenizer files

The real weights cannot travel (64 MiB), so every model here has random weights made on the spot
from a fixed seed, with SmolLM2's real tokenizer: its tokens are meaningless, which is why the
agreement checks compare backends with each other rather than with expected text. Each stage runs
in its own process (a crash or an exhausted GPU loses one stage, not the run) and the JSON file is
rewritten after every stage. Stages: kernels, models, agreement, offline, serving.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))      # shared/, compare/; this folder is on the path already

from gpu_check_stages import STAGES  # noqa: E402

STAGED_TOKENIZER = REPO / ".gpu_check" / "tokenizer"
NOTE = ("All models are random-weight models built on this machine from seed 0 with SmolLM2's real "
        "tokenizer (the real weights cannot travel): generated text is meaningless; agreement "
        "compares backends, graphs on/off, with one another.")
# Seconds each stage may take on a GPU; the dry run gets the same limits.
STAGE_LIMITS = {"kernels": 200, "models": 90, "agreement": 120, "offline": 150, "serving": 200}


def find_tokenizer(given: str | None) -> Path | None:
    """--tokenizer, else the staged copy, else the default model folder of the twinserve cache."""
    from shared.worker.model_fetch import cache_dir

    candidates = [Path(given)] if given else [STAGED_TOKENIZER,
                                              cache_dir() / "models" / "SmolLM2-135M-Instruct"]
    for c in candidates:
        if (c / "tokenizer.json").exists() and (c / "config.json").exists():
            return c
    return None


def stage_tokenizer() -> int:
    """Copy config.json and the tokenizer files (~2 MB) to .gpu_check/tokenizer for the trip."""
    from compare.tiny_model import TOKENIZER_FILES

    source = find_tokenizer(None)
    if source is None:
        raise SystemExit("no cached default model to copy from: run `twinserve fetch-model` first")
    STAGED_TOKENIZER.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", *TOKENIZER_FILES):
        if (source / name).exists() and source != STAGED_TOKENIZER:
            shutil.copy2(source / name, STAGED_TOKENIZER / name)
    print(f"tokenizer files in {STAGED_TOKENIZER}")
    return 0


def environment() -> dict[str, Any]:
    import importlib.util

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cpu": platform.processor() or platform.machine(),
                           "cpus": os.cpu_count(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    needed = ("pytest", "safetensors", "tokenizers", "msgspec", "zmq", "uvicorn", "starlette", "httpx")
    env["missing_modules"] = [m for m in needed if importlib.util.find_spec(m) is None]
    return env


def run_stage(name: str, args: argparse.Namespace, workdir: Path, deadline: float) -> dict[str, Any]:
    """Run one stage in a child process under its time limit; return its result dict."""
    limit = min(STAGE_LIMITS[name], deadline - time.monotonic())
    if limit < 20:
        return {"ok": False, "skipped": "out of time"}
    result_path = workdir / f"stage-{name}.json"
    result_path.unlink(missing_ok=True)          # never report an earlier run's result
    cmd = [sys.executable, __file__, "--stage", name, "--stage-json", str(result_path),
           "--workdir", str(workdir)]
    cmd += ["--tokenizer", str(args.tokenizer)] if args.tokenizer else []
    cmd += ["--cpu-dry-run"] if args.cpu_dry_run else []
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tail, code = proc.communicate(timeout=limit)[0][-3000:], proc.returncode
    except subprocess.TimeoutExpired:
        # SIGTERM first: the stage turns it into SystemExit, so its servers get stopped.
        proc.terminate()
        try:
            output = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            output = proc.communicate()[0]
        tail, code = f"timed out after {limit:.0f}s\n{output[-3000:]}", None
    result: dict[str, Any] = {"ok": False}
    if result_path.exists():
        result = json.loads(result_path.read_text(encoding="utf-8"))
    result["seconds"] = round(time.monotonic() - t0, 1)
    if code != 0 or not result.get("ok"):
        result["ok"] = False
        result["log_tail"] = tail
    return result


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    report: dict[str, Any] = {"schema": "twinserve-gpu-check/1", "note": NOTE,
                              "cpu_dry_run": args.cpu_dry_run, "tokenizer": str(args.tokenizer),
                              "environment": environment(),
                              "stages": {}}
    print(NOTE, flush=True)
    for name in STAGES:
        if name in args.skip:
            continue
        print(f"== {name}", flush=True)
        report["stages"][name] = result = run_stage(name, args, workdir, deadline)
        print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=1), flush=True)
        if not result["ok"]:
            print(result.get("log_tail", ""), flush=True)
        report["ok"] = all(r["ok"] for r in report["stages"].values())
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"{'PASS' if report.get('ok') else 'FAIL'}: wrote {out}", flush=True)
    return 0 if report.get("ok") else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="result JSON (default: $OUT/gpu_check.json)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="tiny shapes on CPU, Triton interpreter for the kernels; no CUDA graphs")
    p.add_argument("--tokenizer", help="folder with config.json + tokenizer.json (default: staged)")
    p.add_argument("--workdir", default="/tmp/twinserve-gpu-check", help="models and scratch files")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting stages after this")
    p.add_argument("--skip", nargs="*", default=[], choices=STAGES)
    p.add_argument("--stage-tokenizer", action="store_true", help=stage_tokenizer.__doc__)
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)      # child process
    p.add_argument("--stage-json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stage_tokenizer:
        return stage_tokenizer()
    if args.stage:   # a child: the parent already resolved --tokenizer (absent: none found)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run `finally`s and `with` exits
        return STAGES[args.stage](args)
    args.tokenizer = find_tokenizer(args.tokenizer)
    return orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
