"""One linear layer's weight in one format, and its matmul: ``y = x @ W^T``.

    dense  the float weight (bf16 / fp32): F.linear
    bf16   bf16 weights under float32 activations (auto only, where bf16 GEMMs win)
    int8   weight-only, symmetric per output channel:  W ~ q * s[n]
           -> torch._weight_int8pack_mm (float activations, int8 weights)
    int4   weight-only, asymmetric per group of 32 input channels: W ~ q * d + z in GGUF's Q4_1
           block layout (float16 d, z) -> the native Q4 kernel at small float32 batches, else
           torch._weight_int4pack_mm_for_cpu on a pack built from the same blocks
    w8a8   int8 weights per output channel and int8 activations per token (dynamic):
           y ~ (qx @ qw^T) * sx[m] * sw[n], int32 accumulation in torch._int_mm

The weight-only kernels run on bf16 activations whatever the model's dtype (a float32 model's
activations are cast around them): torch's CPU int8/int4 GEMMs are tuned for bf16, and on an
AVX2 EPYC fed float32 they measured 7x slower (50 vs 7.5 ms for one token through all of
SmolLM2-135M's linear layers).

Small float32 batches (decode) take the native kernels where a format has a C layout
(``native_mat``): float32 dense, int8 and the Q4 blocks; the fused decode step reads the same.
Every format keeps what ``dequantize`` needs, so tests compare each matmul against the float
matmul of the dequantized weight: the quantization error and the kernel error are told apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from shared.worker.native.abi import MAT_F32, MAT_INT8, MAT_Q4, MAX_Q4_GROUPS, Q4_GROUP, Mat

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

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

    def native_mat(self) -> Mat | None:
        """The weight as the native kernels read it, or None (no C layout for this format).
        Raw pointers: valid while this format object lives."""
        ...


@dataclass
class Dense:
    weight: torch.Tensor                # [N, K], the activation dtype
    name: str = "none"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()

    def native_mat(self) -> Mat | None:
        w = self.weight
        if w.dtype != torch.float32 or not w.is_contiguous():
            return None
        return Mat(w.data_ptr(), None, None, None, w.shape[0], w.shape[1], MAT_F32)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


@dataclass
class Bf16:
    """bf16 weights for float32 activations (cast around the matmul): on CPUs with AVX-512 BF16
    a batched bf16 GEMM runs 2-4x faster than fp32, while decode steps keep float32 for the
    native kernels. Only ``auto`` picks it, where it measures fastest."""

    weight: torch.Tensor                # [N, K] bfloat16
    name: str = "bf16"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * 2

    def native_mat(self) -> Mat | None:
        return None


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
            return native.gemm_small(self.native_mat(), x, self.num_threads)
        y = torch._weight_int8pack_mm(x.to(KERNEL_DTYPE), self.qweight, self.scale)
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]

    def native_mat(self) -> Mat | None:
        n, k = self.qweight.shape
        return Mat(self.qweight.data_ptr(), self.scale_f32.data_ptr(), None, None, n, k, MAT_INT8)

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * (self.scale.element_size() + 4)


@dataclass
class Q4Blocks:
    """4-bit weights in GGUF's Q4_1 block layout for the native kernels: per group of 32 input
    channels W ~ q * d + z with float16 d and z (5 bits a weight). A checkpoint that was itself
    Q4_1 (the default model's GGUF) round-trips through it exactly."""

    packed: torch.Tensor                # [N, K / 2] uint8: byte j of a group = q[j] | q[j + 16] << 4
    scale: torch.Tensor                 # [N, K / 32] float16
    zero: torch.Tensor                  # [N, K / 32] float16
    mat: Mat = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n, half_k = self.packed.shape
        self.mat = Mat(self.packed.data_ptr(), self.scale.data_ptr(), self.zero.data_ptr(), None,
                       n, 2 * half_k, MAT_Q4)

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Q4Blocks:
        n, k = w.shape
        g = w.float().reshape(n, k // Q4_GROUP, Q4_GROUP)
        lo, hi = g.amin(-1), g.amax(-1)
        d, z = ((hi - lo) / 15.0).half(), lo.half()
        step = d.float()[..., None]
        q = torch.where(step > 0, (g - z.float()[..., None]) / step.clamp(min=1e-30), 0.0)
        q = torch.round(q).clamp(0, 15).to(torch.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        return cls(packed.reshape(n, k // 2).contiguous(), d.contiguous(), z.contiguous())

    def dequantize(self) -> torch.Tensor:
        b = self.packed.view(self.packed.shape[0], -1, 16)
        q = torch.cat([b & 15, b >> 4], dim=-1).float()
        w = q * self.scale.float()[..., None] + self.zero.float()[..., None]
        return w.reshape(self.packed.shape[0], -1)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * (self.scale.numel() + self.zero.numel())


@dataclass
class Int4:
    """The weight as Q4 blocks. Float32 batches of up to ``native.max_rows`` rows run the native
    Q4 kernel; the rest torch's int4 kernel on a pack built from the same blocks on first use
    (a decode-only int4 under ``auto`` never builds it)."""

    blocks: Q4Blocks
    native: NativeKernels | None = None
    num_threads: int = 1
    name: str = "int4"
    _torch_pack: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def from_float(cls, w: torch.Tensor, dtype: torch.dtype,
                   native: NativeKernels | None = None) -> Int4:
        n, k = w.shape
        if k % Q4_GROUP:
            raise ValueError(f"int4: in-features {k} are not a multiple of the group size {Q4_GROUP}")
        if n % 16:      # the tile of torch's CPU pack
            raise ValueError(f"int4: out-features {n} are not a multiple of 16")
        if native is not None and k // Q4_GROUP > MAX_Q4_GROUPS:
            native = None                       # past the native kernel's stack buffers
        return cls(Q4Blocks.from_float(w), native, torch.get_num_threads())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        native = self.native
        if native is not None and x.dtype == torch.float32 and x.shape[0] <= native.max_rows:
            return native.gemm_small(self.blocks.mat, x, self.num_threads)
        packed, scales_zeros = self.torch_pack()
        y = torch._weight_int4pack_mm_for_cpu(x.to(KERNEL_DTYPE), packed, Q4_GROUP, scales_zeros)
        return y.to(x.dtype)

    def torch_pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's CPU int4 pack of q and its [K / 32, N, 2] (scale, zero) for (q - 8) * s + z."""
        if self._torch_pack is None:
            b = self.blocks.packed.view(self.blocks.packed.shape[0], -1, 16)
            q = torch.cat([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1).to(torch.int32)
            d, z = self.blocks.scale.float(), self.blocks.zero.float()
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
            sz = torch.stack([d.t(), (z + 8 * d).t()], dim=-1).to(KERNEL_DTYPE).contiguous()
            self._torch_pack = (packed, sz)
        return self._torch_pack

    def dequantize(self) -> torch.Tensor:
        return self.blocks.dequantize()

    def is_exact_for(self, w: torch.Tensor) -> bool:
        """Whether these blocks hold ``w`` without loss (a checkpoint that was 4-bit already)."""
        err = (self.dequantize() - w.float()).abs().reshape(*self.blocks.scale.shape, Q4_GROUP)
        return bool((err.amax(-1) <= 1e-3 * self.blocks.scale.float() + 1e-7).all())

    @property
    def in_features(self) -> int:
        return self.blocks.mat.k

    @property
    def nbytes(self) -> int:
        extra = 0 if self._torch_pack is None else sum(t.nbytes for t in self._torch_pack)
        return self.blocks.nbytes + extra

    def native_mat(self) -> Mat | None:
        return self.blocks.mat if self.native is not None else None


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

    def native_mat(self) -> Mat | None:
        return None         # int8 activations: torch._int_mm serves every batch size


FORMATS = {"none": Dense, "bf16": Bf16, "int8": Int8, "int4": Int4, "w8a8": W8A8}


def pack(name: str, w: torch.Tensor, dtype: torch.dtype,
         native: NativeKernels | None = None) -> WeightFormat:
    """The weight ``w`` [N, K] in format ``name``, for activations of ``dtype``; ``native``
    kernels serve the formats that have a native path (int8, int4)."""
    if name == "none":
        return Dense(w.to(dtype))
    if name == "bf16":
        return Bf16(w.to(torch.bfloat16).contiguous())
    if name == "int8":
        return Int8.from_float(w, dtype, native)
    if name == "int4":
        return Int4.from_float(w, dtype, native=native)
    return FORMATS[name].from_float(w, dtype)
