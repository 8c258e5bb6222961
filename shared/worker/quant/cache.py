"""Quantized weights cached on disk, so a warm start loads them instead of re-quantizing.

Packing the default model (int4 blocks, int8 rows, the int4 exactness check) takes ~4 s of a
~5 s model load on a 2-core CPU; reading the packed tensors back takes a fraction of that.
Only packed formats are stored (int8, int4, w8a8); float formats are rebuilt from the loaded
checkpoint, which is loaded anyway. The key covers the checkpoint files (name, size, mtime),
each layer's dispatch, the activation dtype, torch's version and this file's FORMAT_VERSION;
a missing, stale or unreadable entry just means quantizing again (and rewriting it).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from shared.worker.models.layers import Linear
from shared.worker.quant.formats import W8A8, Int8, WeightFormat, pack
from shared.worker.quant.int4 import MAX_Q4_GROUPS, Q4_GROUP, Int4, Q4Blocks
from shared.worker.quant.linear import Dispatch, QuantLinear, pack_or_dense

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3      # 2: W8A8 in w8a8.c's blocks; 3: w8a8 stands in for an inexact int4
_FIELDS = {"int8": ("qweight", "scale", "scale_f32"), "w8a8": ("packed", "scale"),
           "int4": ("packed", "scale", "zero")}
_PACKED = {"int8": Int8, "w8a8": W8A8, "int4": Int4}


def cache_key(checkpoint_files: list[Path], dispatch: Dispatch, dtype: torch.dtype,
              exact_int4: bool) -> str:
    ident = [(p.name, (s := p.stat()).st_size, s.st_mtime_ns) for p in checkpoint_files]
    blob = json.dumps([FORMAT_VERSION, torch.__version__, ident, dispatch.ranges, str(dtype),
                       exact_int4])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def save(model: nn.Module, path: Path) -> None:
    """Write every QuantLinear's packed tensors and dispatch to ``path`` (atomically)."""
    tensors: dict[str, torch.Tensor] = {}
    layers: dict[str, list] = {}
    for name, module in model.named_modules():
        if not isinstance(module, QuantLinear):
            continue
        layers[name] = [list(r) for r in module.dispatch.ranges]
        for fmt, f in module.formats.items():
            if not isinstance(f, _PACKED.get(fmt, ())):
                continue    # float weights, or a shape the format refused: rebuilt on load
            for field in _FIELDS[fmt]:
                src = f.blocks if isinstance(f, Int4) else f
                tensors[f"{name}|{fmt}|{field}"] = getattr(src, field).contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"layers": json.dumps(layers)})
    os.replace(tmp, path)


def load(model: nn.Module, path: Path, dtype: torch.dtype,
         native: NativeKernels | None) -> int | None:
    """Swap the model's Linears for the cached QuantLinears; their bytes, or None (no entry)."""
    if not path.exists():
        return None
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            layers = json.loads(f.metadata()["layers"])
        built = {name: _layer(model.get_submodule(name), name, ranges, tensors, dtype, native)
                 for name, ranges in layers.items()}
    except Exception as exc:  # noqa: BLE001 - any unreadable entry: quantize again
        logger.warning("quantized-weight cache %s unreadable (%s); quantizing again", path, exc)
        return None
    total = 0
    for name, layer in built.items():
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer)
        total += layer.nbytes
    return total


def _layer(module: nn.Module, name: str, ranges: list, tensors: dict[str, torch.Tensor],
           dtype: torch.dtype, native: NativeKernels | None) -> QuantLinear:
    if not isinstance(module, Linear):
        raise ValueError(f"{name} is not a Linear in this model")
    dispatch = Dispatch(tuple((int(r), str(f)) for r, f in ranges))
    weight = module.weight.detach()
    formats = {fmt: _format(fmt, weight, tensors, f"{name}|{fmt}", dtype, native)
               for fmt in dispatch.formats}
    bias = None if module.bias is None else module.bias.detach().to(dtype)
    return QuantLinear(formats, bias, dispatch)


def _format(fmt: str, weight: torch.Tensor, tensors: dict[str, torch.Tensor], prefix: str,
            dtype: torch.dtype, native: NativeKernels | None) -> WeightFormat:
    if fmt not in _FIELDS:
        return pack(fmt, weight, dtype)       # float formats: a cast of the loaded weight
    if f"{prefix}|{_FIELDS[fmt][0]}" not in tensors:    # not stored: the format refused the shape
        return pack_or_dense(fmt, weight, dtype, native)
    t = {field: tensors[f"{prefix}|{field}"] for field in _FIELDS[fmt]}
    threads = torch.get_num_threads()
    if fmt == "int8":
        return Int8(t["qweight"], t["scale"], t["scale_f32"], native, threads)
    if fmt == "w8a8":
        return W8A8(t["packed"], t["scale"], native, threads)
    if weight.shape[1] // Q4_GROUP > MAX_Q4_GROUPS:
        native = None                          # as Int4.from_float: past the native kernel
    return Int4(Q4Blocks(t["packed"], t["scale"], t["zero"]), native, threads)
