"""What ``--quantization`` means on this device: which formats a model keeps and when each runs."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from shared.worker.models.arch_config import ArchConfig
from shared.worker.models.layers import Linear
from shared.worker.native.build import NativeKernels
from shared.worker.quant import cache as quant_cache
from shared.worker.quant.int4 import Int4
from shared.worker.quant.linear import Dispatch, quantize_model
from shared.worker.quant.tuning import faster_dense_dtype, tuned_dispatch

logger = logging.getLogger(__name__)

# The formats ``auto`` may choose between: those whose perplexity stays within 2% of bf16's on
# the default model (python -m compare.quality; the figures are in the README). int4 joins them
# only for a checkpoint that was 4-bit already (the default model is a Q4_1 GGUF), and then only
# in the layers it holds exactly: it loses nothing there and reads half of int8's bytes.
AUTO_CANDIDATES = ("none", "int8", "w8a8")


def checkpoint_is_int4(model: nn.Module) -> bool:
    """Whether the first and last decoder layers' weights are exactly 4-bit blocks."""
    layers = [model.layers[0], model.layers[-1]]
    weights = [m.weight.detach() for layer in layers for m in layer.modules()
               if isinstance(m, Linear)]
    try:
        return all(Int4.from_float(w, w.dtype).is_exact_for(w) for w in weights)
    except ValueError:      # a shape int4 cannot hold
        return False


def resolve_dtype(name: str, device: torch.device, arch: ArchConfig,
                  tuning_cache: Path | None, native: bool = False) -> torch.dtype:
    """``--dtype``: auto is bf16 on CUDA. On CPU with the native kernels it is float32: their
    decode step runs float32 activations, and ``--quantization auto`` still gives the batched
    matmuls bf16 weights where those measure faster. Without them, whichever of bf16 and fp32
    measures faster for this model's matmuls (AVX-512 BF16 favours bf16; AVX2 fp32)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return torch.float32 if native else faster_dense_dtype(arch, tuning_cache)
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_kv_dtype(name: str, dtype: torch.dtype, attention_backend: str,
                     fast_bf16: bool = False) -> torch.dtype:
    """``--kv-cache-dtype``: auto is the model's dtype, or bf16 where ``fast_bf16`` (quantized
    weights on CPU, whose native attention reads a bf16 cache of this shape at full speed:
    half the bytes a decode step streams). A cache narrower than the activations is widened
    where attention reads it (native and torch backends); the Triton kernels read the cache in
    the activations' dtype, so they refuse another."""
    if name == "auto":
        return torch.bfloat16 if fast_bf16 and attention_backend == "native" else dtype
    kv = {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
    if kv != dtype and attention_backend == "triton":
        raise ValueError(f"--kv-cache-dtype {name} needs the activations' dtype ({dtype}) with "
                         "the triton attention backend")
    return kv


def apply_quantization(model: nn.Module, mode: str, dtype: torch.dtype, device: torch.device,
                       tuning_cache: Path | None, native: NativeKernels | None = None,
                       weights_cache: tuple[Path, list[Path]] | None = None) -> Dispatch | None:
    """Quantize ``model``'s linear layers in place for ``mode``; None when it keeps its floats.

    ``weights_cache``: (folder, the checkpoint's files) to load packed weights from, or store
    them in, instead of quantizing on every start."""
    if mode == "none":
        return None
    if device.type != "cpu":
        if mode == "auto":      # no GPU measurement yet says another format pays there
            return None
        raise ValueError(f"--quantization {mode} runs on CPU only (use none or auto on {device.type})")
    exact_int4 = mode == "auto" and checkpoint_is_int4(model)
    if mode == "auto":
        candidates = [*AUTO_CANDIDATES, *(["int4"] if exact_int4 else []),
                      *(["bf16"] if dtype == torch.float32 else [])]
        dispatch = tuned_dispatch(model.arch, candidates, dtype, tuning_cache, native)
    else:
        dispatch = Dispatch.single(mode)
    if dispatch.formats == ["none"]:
        logger.info("quantization %s: the float weights measured fastest at every size", mode)
        return None
    nbytes = _quantize_cached(model, dispatch, dtype, native, exact_int4, weights_cache)
    logger.info("quantization %s: %s; linear weights %.0f MiB", mode, dispatch.describe(),
                nbytes / (1 << 20))
    return dispatch


def _quantize_cached(model: nn.Module, dispatch: Dispatch, dtype: torch.dtype,
                     native: NativeKernels | None, exact_int4: bool,
                     weights_cache: tuple[Path, list[Path]] | None) -> int:
    if weights_cache is None:
        return quantize_model(model, dispatch, dtype, native, exact_int4=exact_int4)
    folder, files = weights_cache
    path = folder / f"{quant_cache.cache_key(files, dispatch, dtype, exact_int4)}.safetensors"
    nbytes = quant_cache.load(model, path, dtype, native)
    if nbytes is not None:
        logger.info("quantized weights loaded from %s", path)
        return nbytes
    nbytes = quantize_model(model, dispatch, dtype, native, exact_int4=exact_int4)
    try:
        quant_cache.save(model, path)
    except OSError as exc:      # a read-only cache costs the next start, nothing more
        logger.warning("cannot write the quantized-weight cache %s: %s", path, exc)
    return nbytes
