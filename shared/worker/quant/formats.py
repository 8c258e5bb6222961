"""One linear layer's weight in one format, and its matmul: ``y = x @ W^T``.

    dense  the float weight (bf16 / fp32): F.linear
    int8   weight-only, symmetric per output channel:  W ~ q * s[n]
           -> torch._weight_int8pack_mm (float activations, int8 weights)
    int4   weight-only, asymmetric per group of G input channels: W ~ (q - 8) * s[g, n] + z[g, n]
           -> torch._weight_int4pack_mm_for_cpu (torch's CPU int4 GEMM, tinygemm layout)
    w8a8   int8 weights per output channel and int8 activations per token (dynamic):
           y ~ (qx @ qw^T) * sx[m] * sw[n], int32 accumulation in torch._int_mm

The weight-only kernels run on bf16 activations whatever the model's dtype (a float32 model's
activations are cast around them): torch's CPU int8/int4 GEMMs are tuned for bf16, and on an
AVX2 EPYC fed float32 they measured 7x slower (50 vs 7.5 ms for one token through all of
SmolLM2-135M's linear layers).

Every format keeps what ``dequantize`` needs, so tests compare each matmul against the float
matmul of the dequantized weight: the quantization error and the kernel error are told apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

INT4_GROUP_SIZE = 32      # divides every in-feature count of the Llama family we serve
KERNEL_DTYPE = torch.bfloat16     # what the weight-only kernels multiply


class WeightFormat(Protocol):
    name: str

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x's dtype."""
        ...

    def dequantize(self) -> torch.Tensor:
        """The weight this format represents, [N, K] float32."""
        ...

    @property
    def nbytes(self) -> int: ...

    @property
    def in_features(self) -> int: ...


@dataclass
class Dense:
    weight: torch.Tensor                # [N, K], the activation dtype
    name: str = "none"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


def _symmetric_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: q in [-127, 127], scale = absmax / 127 (float32)."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


@dataclass
class Int8:
    """With ``native`` kernels, float32 batches of up to ``native.max_rows`` rows take the native
    int8 GEMV (no casts; one pass over the weights for all rows); the rest torch's kernel."""

    qweight: torch.Tensor               # [N, K] int8
    scale: torch.Tensor                 # [N], KERNEL_DTYPE
    scale_f32: torch.Tensor             # [N] float32, for the native kernel
    native: NativeKernels | None = None
    num_threads: int = 1
    name: str = "int8"

    @classmethod
    def from_float(cls, w: torch.Tensor, dtype: torch.dtype,
                   native: NativeKernels | None = None) -> Int8:
        q, scale = _symmetric_int8(w)
        return cls(q.contiguous(), scale.to(KERNEL_DTYPE), scale, native, torch.get_num_threads())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        native = self.native
        if native is not None and x.dtype == torch.float32 and x.shape[0] <= native.max_rows:
            return native.int8_gemm_small(x, self.qweight, self.scale_f32, self.num_threads)
        y = torch._weight_int8pack_mm(x.to(KERNEL_DTYPE), self.qweight, self.scale)
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * (self.scale.element_size() + 4)


@dataclass
class Int4:
    packed: torch.Tensor                # torch's CPU int4 pack of q [N, K] (uint8)
    scales_zeros: torch.Tensor          # [K / G, N, 2]: (s, z), KERNEL_DTYPE
    group_size: int
    shape: tuple[int, int]
    name: str = "int4"

    @classmethod
    def from_float(cls, w: torch.Tensor, dtype: torch.dtype,
                   group_size: int = INT4_GROUP_SIZE) -> Int4:
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"int4: in-features {k} are not a multiple of the group size {group_size}")
        if n % 16:      # the CPU pack's tile
            raise ValueError(f"int4: out-features {n} are not a multiple of 16")
        g = w.float().reshape(n, k // group_size, group_size)
        lo, hi = g.amin(-1), g.amax(-1)
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)                  # [N, K/G]
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
        zero = lo + 8 * scale                    # so that (q - 8) * s + z == q * s + lo
        packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).to(torch.int32), 1)
        sz = torch.stack([scale.t(), zero.t()], dim=-1).to(KERNEL_DTYPE).contiguous()
        return cls(packed, sz, group_size, (n, k))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x.to(KERNEL_DTYPE), self.packed, self.group_size,
                                              self.scales_zeros)
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        # The pack's layout is the kernel's business: recover q by multiplying the identity.
        n, k = self.shape
        eye = torch.eye(k, dtype=torch.float32)
        zeros = self.scales_zeros.float().clone()
        zeros[..., 0], zeros[..., 1] = 1.0, 8.0                   # (q - 8) * 1 + 8 = q
        q = torch._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, zeros).t()
        s = self.scales_zeros[..., 0].float().t().repeat_interleave(self.group_size, dim=1)
        z = self.scales_zeros[..., 1].float().t().repeat_interleave(self.group_size, dim=1)
        return (q.round() - 8) * s + z

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * self.scales_zeros.element_size()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token int8 of activations x [M, K]: (q int8, scale [M] float32); the same
    rule as the weights' per-output-channel scales, one row at a time."""
    return _symmetric_int8(x)


@dataclass
class W8A8:
    qweight_t: torch.Tensor             # [K, N] int8, _int_mm's right operand
    scale: torch.Tensor                 # [N] float32
    name: str = "w8a8"

    @classmethod
    def from_float(cls, w: torch.Tensor, dtype: torch.dtype) -> W8A8:
        q, scale = _symmetric_int8(w)
        return cls(q.t().contiguous(), scale)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        qx, sx = quantize_rows(x)
        acc = torch._int_mm(qx, self.qweight_t)
        return (acc.float() * sx[:, None] * self.scale[None, :]).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qweight_t.t().float() * self.scale[:, None]

    @property
    def in_features(self) -> int:
        return self.qweight_t.shape[0]

    @property
    def nbytes(self) -> int:
        return self.qweight_t.numel() + self.scale.numel() * 4


FORMATS = {"none": Dense, "int8": Int8, "int4": Int4, "w8a8": W8A8}


def pack(name: str, w: torch.Tensor, dtype: torch.dtype,
         native: NativeKernels | None = None) -> WeightFormat:
    """The weight ``w`` [N, K] in format ``name``, for activations of ``dtype``; ``native``
    kernels serve the formats that have a native path (int8)."""
    if name == "none":
        return Dense(w.to(dtype))
    if name == "int8":
        return Int8.from_float(w, dtype, native)
    return FORMATS[name].from_float(w, dtype)
