"""Measure which weight format multiplies fastest at which batch size, on this machine.

``--quantization auto`` needs the crossover between, say, int8 weight-only GEMV (memory-bound,
fast at one row) and dense bf16 GEMM (fast at many rows). It differs between the CPUs this
project runs on (AVX-512 with bf16 one day, AVX2 the next), so it is measured, not guessed:
one layer's worth of the model's real matmul shapes, at row counts 1..256, each format timed
on random weights (past 256 rows the last winner keeps running: all formats there are
compute-bound and their order stops changing). 128 is past the native kernels' 64 rows, where
the weight-only formats fall back to torch's kernels: extending the 64-row winner instead ran
1,024-token prefills through int8 1.5x slower than float32. 256 because on an Intel Xeon with
AMX, bf16 ties W8A8 at 128 rows and wins by 1.3x at 256: prefill chunks there run bf16. The
result is cached on disk under a key of everything that changes it (torch version, CPU model
and instruction set, threads, dtype, shapes, candidate formats), so only the first start on a
machine pays for it (8 s for the default model on that Xeon).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from shared.worker.models.arch_config import ArchConfig
from shared.worker.native.build import NativeKernels
from shared.worker.quant.linear import Dispatch, pack_or_dense

logger = logging.getLogger(__name__)

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PRUNE = 3.0     # a format this many times slower than dense at some size is not timed above it
BUDGET_S = 20.0     # the most one measurement may take (a loaded machine stops it early)
Shapes = list[tuple[int, int, int]]     # (out, in, how many layers of the model have it)


def linear_shapes(arch: ArchConfig) -> Shapes:
    """The decoder's linear shapes and their counts (not the lm_head: it runs once per step on
    the sampled rows, not on every token)."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    h, i, n = arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers
    counts = Counter({(q + 2 * kv, h): n, (h, q): n, (2 * i, h): n, (h, i): n})
    return [(out, inp, c) for (out, inp), c in sorted(counts.items())]


def cpu_name() -> str:
    """The CPU model's name (machines of this project's kind differ from day to day)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cache_key(shapes: Shapes, candidates: list[str], dtype: torch.dtype,
              rows: tuple[int, ...], native: str | None = None) -> str:
    facts = {"torch": torch.__version__, "cpu": cpu_name(),
             "isa": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
             "dtype": str(dtype), "shapes": shapes, "candidates": candidates, "rows": rows,
             "native": native}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _time_ms(fn, reps: int) -> float:  # noqa: ANN001 - a zero-argument callable
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


@torch.inference_mode()
def measure(shapes: Shapes, candidates: list[str], dtype: torch.dtype,
            rows: tuple[int, ...] = ROWS, budget_s: float = BUDGET_S,
            native: NativeKernels | None = None) -> dict[str, dict[int, float]]:
    """ms for all the model's decoder matmuls, per format and row count (best of a few runs).

    Every layer gets its own random weight, as in the model: timing one layer's weights 30
    times over would keep them in cache and flatter the memory-bound small-batch formats by 2x.
    A format that falls ``PRUNE`` times behind the float weights at some size is not timed at
    larger ones (recorded as infinitely slow there): W8A8 without VNNI or bf16 without AVX-512 would
    otherwise spend seconds proving they lose. Past ``budget_s`` (a loaded machine) no larger
    size is timed; the dispatch then extends the last measured winner.
    """
    gen = torch.Generator().manual_seed(0)
    # A shape a format refuses is timed as the float weight the quantized model keeps for it.
    layers = {name: [pack_or_dense(name, torch.randn(n, k, generator=gen) * 0.02, dtype, native)
                     for n, k, c in shapes for _ in range(c)] for name in candidates}
    out: dict[str, dict[int, float]] = {name: {} for name in candidates}
    alive, deadline = list(candidates), time.perf_counter() + budget_s
    for m in rows:
        if time.perf_counter() > deadline:
            logger.warning("matmul timing stopped at %d rows: over its %.0f s budget", m, budget_s)
            break
        xs = {k: torch.randn(m, k, generator=gen).to(dtype) for _, k, _ in shapes}
        for name in candidates:
            out[name][m] = _time_layers(layers[name], xs, m) if name in alive else math.inf
        # Against the float weights, which scale best with rows: a weight-only format may lose
        # 4x to int8 at one row and still win at 64 (never pruned itself).
        ref = out["none"][m] if "none" in out else min(out[name][m] for name in candidates)
        alive = [name for name in alive if name == "none" or out[name][m] <= PRUNE * ref]
    return out


def _time_layers(layers: list, xs: dict[int, torch.Tensor], m: int) -> float:
    def run() -> None:
        for f in layers:
            f.matmul(xs[f.in_features])
    return _time_ms(run, reps=2 if m <= 16 else 1)


def dispatch_from(times: dict[str, dict[int, float]]) -> Dispatch:
    """Ranges of row counts where one format is fastest; the last range is open-ended. Nothing
    measured (a timing cut short at once): the float weights throughout."""
    rows = sorted(next(iter(times.values())))
    if not rows:
        return Dispatch.single("none")
    winners = [min(times, key=lambda f: times[f][m]) for m in rows]
    ranges: list[tuple[int, str]] = []
    for m, name in zip(rows, winners):
        if ranges and ranges[-1][1] == name:
            ranges[-1] = (m, name)
        else:
            ranges.append((m, name))
    ranges[-1] = (sys.maxsize, ranges[-1][1])
    return Dispatch(tuple(ranges))


def measured_times(shapes: Shapes, candidates: list[str], dtype: torch.dtype,
                   cache: Path | None, rows: tuple[int, ...] = ROWS,
                   native: NativeKernels | None = None) -> dict[str, dict[int, float]]:
    """``measure``'s result for this machine, from ``cache`` when it has it (else measured and
    written there atomically)."""
    key = cache_key(shapes, candidates, dtype, rows, None if native is None else native.path.name)
    path = None if cache is None else cache / f"quant-{key}.json"
    if path is not None and path.exists():
        try:
            data = json.loads(path.read_text())
            return {f: {int(m): float(t) for m, t in d.items()} for f, d in data.items()}
        except (ValueError, KeyError, AttributeError):
            logger.warning("ignoring an unreadable tuning cache %s", path)
    logger.info("timing %s matmuls (%s) once for this machine; cached in %s",
                "/".join(candidates), dtype, cache)
    t0 = time.perf_counter()
    times = measure(shapes, candidates, dtype, rows, native=native)
    logger.info("measured %s matmuls (%s) in %.1f s", "/".join(candidates), dtype,
                time.perf_counter() - t0)
    complete = all(len(d) == len(rows) for d in times.values())
    if path is not None and complete:       # a timing cut short is redone on the next start
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(times, indent=1))      # json writes inf as Infinity
        tmp.replace(path)
    return times


def tuned_dispatch(arch: ArchConfig, candidates: list[str], dtype: torch.dtype,
                   cache: Path | None, native: NativeKernels | None = None) -> Dispatch:
    """The measured dispatch for this model and machine (with these native kernels)."""
    times = measured_times(linear_shapes(arch), candidates, dtype, cache, native=native)
    return dispatch_from(times)


def faster_dense_dtype(arch: ArchConfig, cache: Path | None) -> torch.dtype:
    """bf16 or fp32 for the float weights, whichever multiplies faster at a batched size: bf16
    wins by 2-4x where the CPU has AVX-512 BF16 and loses by 3x on AVX2. Timed at 16 rows only:
    one size settles it, and bf16 on AVX2 is slow enough to make more sizes costly."""
    shapes = linear_shapes(arch)
    # float32 first: a tie (nothing measured on a loaded machine) keeps the exact dtype.
    total = {dt: measured_times(shapes, ["none"], dt, cache, rows=(16,))["none"].get(16, math.inf)
             for dt in (torch.float32, torch.bfloat16)}
    return min(total, key=total.__getitem__)
