"""Optional Triton import and the checks every launcher shares.

Kernel modules take ``triton``, ``tl`` and ``jit`` from here. Without Triton installed ``jit`` leaves
the kernel a plain (never called) function, so the module and its torch reference still import.
Set ``TRITON_INTERPRET=1`` before the first import to run the kernels on CPU tensors.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # the CPU path never needs it
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False

# Dtypes the attention kernels take for q/k/v and the cache.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def jit(fn: Callable[..., Any]) -> Any:
    return triton.jit(fn) if HAS_TRITON else fn


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dot_options(dtype: torch.dtype) -> dict[str, Any]:
    """Constexprs for ``mma``: fp32 dots default to TF32 on NVIDIA GPUs (~1e-3 error), so ask
    for full precision; the interpreter (Triton 3.9) returns garbage for bf16 dots, so upcast."""
    upcast = dtype == torch.bfloat16 and interpreting()
    return {"DOT_PREC": "ieee" if dtype == torch.float32 or upcast else "tf32", "DOT_UPCAST": upcast}


@jit
def mma(a, b, DOT_PREC: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """a @ b with a float32 result."""
    if DOT_UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PREC)


def check_ready(*tensors: torch.Tensor) -> None:
    """Triton installed, all tensors on one device, and that device one Triton can run on."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed: pip install triton (or use the torch backend)")
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors are on different devices: {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"Triton kernels need CUDA tensors (got {device}); "
                         "set TRITON_INTERPRET=1 before importing triton to run them on CPU")


def check_tensor(name: str, t: torch.Tensor, ndim: int,
                 dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES, last_contiguous: bool = True) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if last_contiguous and t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both [num_blocks, block_size, kv_heads, head_dim], same dtype, same strides."""
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
                         f"{tuple(v_cache.shape)} {v_cache.dtype} differ")
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache strides differ: {k_cache.stride()} vs {v_cache.stride()}")
