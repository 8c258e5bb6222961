"""Build (once per machine, cached) and load twinserve's native CPU kernels.

The C files here (GEMV, paged attention, the fused decode step) are compiled with gcc into one
shared library called through ctypes: no torch headers, so a build takes a few seconds, and a missing compiler or a failed build only means
the pure-torch path (one warning line). The library is cached under the twinserve cache,
keyed by the source, the compiler, its flags and the CPU's instruction sets: machines of this
project's kind alternate between CPUs with and without AVX-512, and a build for one must never
load on the other. ``TWINSERVE_NATIVE=0`` turns the native kernels off.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from shared.worker.native.abi import A512_DIM, A512_GROUP, STAGES, Mat

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "kernels.c", HERE / "q4.c", HERE / "w8a8.c", HERE / "q4v.c", HERE / "attention.c", HERE / "decode.c"]
HEADERS = [HERE / "native.h", HERE / "vec.h", HERE / "actq.h", HERE / "xq.h", HERE / "tiles.h",
           HERE / "attn512.h"]
_BASE_FLAGS = ["-O3", "-shared", "-fPIC", "-fopenmp", "-std=c11"]
STAGE_TIMES_FLAG = "-DTWINSERVE_STAGE_TIMES"    # decode.c's stage timers (compare.step_profile)
_ISA_FLAGS = {"AVX512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"],
              "AVX2": ["-mavx2", "-mfma", "-mf16c"]}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isa_flags(capability: str | None = None) -> list[str]:
    """Compiler flags for the instruction sets this CPU has (torch's own detection, plus
    AVX512-VNNI from /proc/cpuinfo for the W8A8 kernel: torch reports AVX-512 without it)."""
    cap = (capability or torch.backends.cpu.get_cpu_capability()).split()[0].upper().replace("_", "")
    flags = list(_ISA_FLAGS.get(cap, []))
    if cap == "AVX512" and capability is None and "avx512_vnni" in _cpu_flags():
        flags.append("-mavx512vnni")
    return flags


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build_key(cc: str, flags: list[str]) -> str:
    done = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True)
    version = done.stdout.split("\n")[0]
    texts = [p.read_text() for p in SOURCES + HEADERS]
    facts = "\n".join([*texts, cc, version, " ".join(flags)])
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


def build(cache: Path, flags: list[str] | None = None) -> Path:
    """The compiled library for this machine (built now if it is not in ``cache``)."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    flags = isa_flags() if flags is None else flags
    target = cache / f"twinserve-native-{build_key(cc, flags)}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:     # atomic: build aside, then rename
        out = Path(tmp) / target.name
        cmd = [cc, *_BASE_FLAGS, *flags, *map(str, SOURCES), "-o", str(out), "-lm"]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
        out.replace(target)
    return target


class NativeKernels:
    """The loaded library, its functions typed for ctypes."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        # Every pointer is a c_void_p (tensor.data_ptr(), ctypes.addressof(struct)).
        lib.mat_gemm_small.argtypes = [ptr, ptr, i64, ptr, c_int]
        lib.mat_gemm_w8a8.argtypes = [ptr, ptr, i64, ptr, c_int]
        lib.decode_forward.argtypes = [ptr, ptr, ptr, ptr, c_int]
        lib.paged_attention.argtypes = [ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, c_int]
        for f in (lib.mat_gemm_small, lib.mat_gemm_w8a8, lib.decode_forward, lib.paged_attention):
            f.restype = c_int
        lib.native_stage_times.argtypes = [ptr]
        lib.native_isa.restype = ctypes.c_char_p
        self._lib = lib
        self.isa = lib.native_isa().decode()
        self.path = path
        self.max_rows: int = lib.native_max_rows()      # native.h's MAX_ROWS
        self.vnni = bool(lib.native_has_vnni())         # W8A8 and Q4V run here (else torch's path)

    def fast_bf16_attention(self, head_dim: int, group: int) -> bool:
        """Whether attention.c reads a bf16 cache of this shape with its AVX-512 tile (widening
        in registers); elsewhere a bf16 cache goes through a copy and is no faster."""
        return self.isa == "avx512" and head_dim == A512_DIM and group <= A512_GROUP

    def gemm_small(self, mat: Mat, x: torch.Tensor, num_threads: int) -> torch.Tensor:
        """x [M, K] float32 times the weight ``mat`` describes -> [M, N] float32 (M <= max_rows)."""
        x = x.contiguous()
        out = torch.empty(x.shape[0], mat.n, dtype=torch.float32)
        rc = self._lib.mat_gemm_small(ctypes.addressof(mat), x.data_ptr(), x.shape[0],
                                      out.data_ptr(), num_threads)
        if rc != 0:
            raise ValueError(f"gemm_small: {x.shape[0]} rows (at most {self.max_rows}) "
                             f"of a kind-{mat.kind} [{mat.n}, {mat.k}] weight")
        return out

    def gemm_w8a8(self, mat: Mat, x: torch.Tensor, num_threads: int) -> torch.Tensor:
        """x [M, K] float32 (any M) times a MAT_W8A8 or MAT_Q4V weight -> [M, N] float32."""
        x = x.contiguous()
        out = torch.empty(x.shape[0], mat.n, dtype=torch.float32)
        if self._lib.mat_gemm_w8a8(ctypes.addressof(mat), x.data_ptr(), x.shape[0], out.data_ptr(),
                                   num_threads) != 0:
            raise ValueError(f"gemm_w8a8: {x.shape[0]} rows of a kind-{mat.kind} [{mat.n}, {mat.k}] weight")
        return out

    def stage_times(self) -> tuple[dict[str, float], int] | None:
        """Seconds per ``decode_forward`` stage since the last call and the calls they cover
        (thread 0's view, barrier waits included), or None: a build without
        ``-DTWINSERVE_STAGE_TIMES`` keeps no timers."""
        out = (ctypes.c_double * (len(STAGES) + 1))()
        if self._lib.native_stage_times(out) != len(STAGES):
            return None
        return dict(zip(STAGES, out[:len(STAGES)], strict=True)), int(out[len(STAGES)])

    def decode_forward(self, *args: object) -> int:
        """decode.c's ``decode_forward``; arguments as its C signature (see FusedDecode)."""
        return self._lib.decode_forward(*args)

    def paged_attention(self, *args: object) -> int:
        """attention.c's ``paged_attention``; arguments as its C signature (see NativeAttention)."""
        return self._lib.paged_attention(*args)


def load_native(cache: Path) -> NativeKernels | None:
    """The native kernels, or None (with one warning) when they cannot be built or loaded."""
    if os.environ.get("TWINSERVE_NATIVE", "1") == "0":
        logger.info("native kernels off (TWINSERVE_NATIVE=0): pure-torch path")
        return None
    try:
        kernels = NativeKernels(build(cache))
    except (OSError, RuntimeError) as exc:
        logger.warning("native kernels unavailable, using the pure-torch path: %s", exc)
        return None
    logger.info("native kernels: %s (%s)", kernels.isa, kernels.path.name)
    return kernels


if __name__ == "__main__":      # `python -m shared.worker.native.build`: build ahead of time
    from shared.worker.model_fetch import cache_dir

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(load_native(cache_dir() / "native"))
