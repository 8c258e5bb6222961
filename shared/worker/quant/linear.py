"""Linear layers that keep one or more weight formats and pick one per call by batch size.

``--quantization int8`` keeps only int8 weights; ``auto`` keeps the formats its measured
``Dispatch`` uses (e.g. int8 for small decode batches, dense bf16 for prefill chunks) and each
call picks by the rows it multiplies: all layers of a step see the same token count, and the
lm_head sees the number of sampled rows.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from shared.worker.models.layers import Linear
from shared.worker.quant.formats import WeightFormat, pack
from shared.worker.quant.int4 import Int4

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dispatch:
    """Which format runs a matmul of M rows: the first ``(max_rows, format)`` with M <= max_rows."""

    ranges: tuple[tuple[int, str], ...]

    @classmethod
    def single(cls, name: str) -> Dispatch:
        return cls(((sys.maxsize, name),))

    def format_for(self, rows: int) -> str:
        for max_rows, name in self.ranges:
            if rows <= max_rows:
                return name
        return self.ranges[-1][1]

    @property
    def formats(self) -> list[str]:
        return list(dict.fromkeys(name for _, name in self.ranges))

    def renamed(self, old: str, new: str) -> Dispatch:
        return Dispatch(tuple((rows, new if name == old else name) for rows, name in self.ranges))

    def describe(self) -> str:
        parts, lo = [], 1
        for max_rows, name in self.ranges:
            hi = "" if max_rows == sys.maxsize else str(max_rows)
            parts.append(f"{name} for {lo}-{hi} rows" if hi else f"{name} from {lo} rows")
            lo = max_rows + 1
        return ", ".join(parts)


class QuantLinear(nn.Module):
    """``y = x W^T + b`` through the format ``dispatch`` picks for x's row count."""

    def __init__(self, formats: dict[str, WeightFormat], bias: torch.Tensor | None,
                 dispatch: Dispatch) -> None:
        super().__init__()
        self.formats = formats
        self.bias = bias
        self.dispatch = dispatch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.formats[self.dispatch.format_for(x.shape[0])].matmul(x)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.formats.values())


def quantize_model(model: nn.Module, dispatch: Dispatch, dtype: torch.dtype,
                   native: NativeKernels | None = None, exact_int4: bool = False) -> int:
    """Swap every ``Linear`` (lm_head included) for a ``QuantLinear`` holding the formats
    ``dispatch`` uses; returns the bytes of all linear weights afterwards. ``exact_int4``: a
    layer whose weight int4 does not hold exactly takes w8a8 (if the dispatch has it) or int8
    where the dispatch says int4.

    The dense float weights are dropped unless a format needs them; a tied lm_head's dense
    weight is the embedding table, which stays for the lookup anyway.
    """
    total = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, Linear):
            continue
        weight = module.weight.detach()
        formats = {f: pack_or_dense(f, weight, dtype, native, name) for f in dispatch.formats}
        layer_dispatch = dispatch
        int4 = formats.get("int4")
        if exact_int4 and isinstance(int4, Int4) and not int4.is_exact_for(weight):
            # W8A8 where the dispatch runs it anywhere (it measured fast on this CPU: the
            # lm_head at one row takes half int8's time on VNNI), else int8 weight-only.
            stand_in = "w8a8" if "w8a8" in dispatch.formats else "int8"
            logger.info("%s: int4 would lose precision here, %s instead", name, stand_in)
            layer_dispatch = dispatch.renamed("int4", stand_in)
            del formats["int4"]
            formats.setdefault(stand_in, pack_or_dense(stand_in, weight, dtype, native, name))
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        layer = QuantLinear(formats, bias, layer_dispatch)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer)
        total += layer.nbytes
    return total


def pack_or_dense(fmt: str, weight: torch.Tensor, dtype: torch.dtype,
                  native: NativeKernels | None, layer: str | None = None) -> WeightFormat:
    """A shape the format cannot hold (e.g. int4 on an odd vocabulary, w8a8 on 48 columns)
    keeps its float weight, under the format's name in the layer's dispatch."""
    try:
        return pack(fmt, weight, dtype, native)
    except ValueError as exc:
        if layer is not None:
            logger.info("%s stays unquantized: %s", layer, exc)
        return pack("none", weight, dtype)
