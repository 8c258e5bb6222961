"""One linear layer's weight in one format, and its matmul: ``y = x @ W^T``.

    dense  the float weight (bf16 / fp32): F.linear
    bf16   bf16 weights under float32 activations (auto only, where bf16 GEMMs win); on the
           CPU past 128 rows padded to a bounded set of row counts (bf16_linear)
    int8   weight-only, symmetric per output channel:  W ~ q * s[n]
           -> torch._weight_int8pack_mm (float activations, int8 weights)
    int4   weight-only, asymmetric per group of 32 input channels: W ~ q * d + z in GGUF's Q4_1
           block layout (float16 d, z) -> the native Q4 kernel at small float32 batches, else
           torch._weight_int4pack_mm_for_cpu on a pack built from the same blocks (int4.py)
    w8a8   int8 weights per output channel and int8 activations per group of 32 (dynamic):
           y ~ sw[n] * sum_g sx[m, g] * (qx_g @ qw_g^T), int32 sums within a group (native
           w8a8.c on AVX512-VNNI). One scale per token, as torch._int_mm would take, lost
           3-5% perplexity on SmolLM2-135M against 0.8% with groups of 32 (compare.quality).

The weight-only kernels run on bf16 activations whatever the model's dtype (a float32 model's
activations are cast around them): torch's CPU int8/int4 GEMMs are tuned for bf16, and on an
AVX2 EPYC fed float32 they measured 7x slower (50 vs 7.5 ms for one token through all of
SmolLM2-135M's linear layers).

Small float32 batches (decode) take the native kernels where a format has a C layout
(``native_mat``): float32 dense, int8, the Q4 blocks and W8A8 (any batch, VNNI only); the
fused decode step reads the same.
Every format keeps what ``dequantize`` needs, so tests compare each matmul against the float
matmul of the dequantized weight: the quantization error and the kernel error are told apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from shared.worker.native.abi import MAT_F32, MAT_INT8, MAT_W8A8, W8_GROUP, Mat
from shared.worker.quant.int4 import KERNEL_DTYPE, Int4

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels



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


def bucket_rows(m: int) -> int:
    """The row count a CPU bf16 GEMM of m rows runs at: m up to 128, else m rounded up to an
    eighth of its power of two (at most 12.5% more rows, 8 shapes per doubling)."""
    if m <= 128:
        return m
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def bf16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w^T`` in bf16 on the CPU, rows padded to ``bucket_rows``: oneDNN builds a kernel
    for every new row count (4 ms against 0.7 for a warm 1,000 x 576 x 1,536 GEMM on an AMX
    Xeon), and prefill chunks come in any size, so unpadded the first prefill of each length
    ran 23-29% slower per token. Padding float32 activations costs nothing: the cast copies anyway."""
    m = x.shape[0]
    rows = bucket_rows(m)
    if rows == m:
        return F.linear(x.to(torch.bfloat16), w)
    padded = torch.empty((rows, x.shape[1]), dtype=torch.bfloat16, device=x.device)
    padded[:m].copy_(x)
    padded[m:].zero_()
    return F.linear(padded, w)[:m]


@dataclass
class Dense:
    weight: torch.Tensor                # [N, K], the activation dtype
    name: str = "none"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == torch.bfloat16 and x.device.type == "cpu":
            return bf16_linear(x, self.weight)
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
        return bf16_linear(x, self.weight).to(x.dtype)

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


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic int8 of activations x [M, K] per group of W8_GROUP along K (K % W8_GROUP == 0):
    (q int8 [M, K], scale [M, K / W8_GROUP] float32), scale = group absmax / 127."""
    m, k = x.shape
    q, scale = _symmetric_int8(x.float().reshape(m * k // W8_GROUP, W8_GROUP))
    return q.reshape(m, k), scale.reshape(m, k // W8_GROUP)


def _blocks(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> uint8 [N / 16, K / 4, 16, 4] of q + 128: w8a8.c's layout."""
    n, k = q.shape
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    return u.reshape(n // 16, 16, k // 4, 4).permute(0, 2, 1, 3).contiguous()


@dataclass
class W8A8:
    """Where the native kernels have AVX512-VNNI, every batch size runs w8a8.c (vpdpbusd);
    elsewhere a float32 matmul of the same rounded activations and the dequantized weight: the
    same numbers, slow (``auto`` does not pick it there)."""

    packed: torch.Tensor                # uint8 [N / 16, K / 4, 16, 4]: q + 128 (w8a8.c)
    scale: torch.Tensor                 # [N] float32
    native: NativeKernels | None = None
    num_threads: int = 1
    name: str = "w8a8"

    @classmethod
    def from_float(cls, w: torch.Tensor, dtype: torch.dtype,
                   native: NativeKernels | None = None) -> W8A8:
        n, k = w.shape
        if n % 16 or k % W8_GROUP:
            raise ValueError(f"w8a8 needs out % 16 == 0 and in % {W8_GROUP} == 0, not [{n}, {k}]")
        q, scale = _symmetric_int8(w)
        return cls(_blocks(q), scale, native, torch.get_num_threads())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        mat = self.native_mat()
        if mat is not None and self.native is not None:
            return self.native.gemm_w8a8(mat, x.float(), self.num_threads).to(x.dtype)
        qx, sx = quantize_groups(x)
        xr = (qx.float().reshape(*sx.shape, W8_GROUP) * sx[..., None]).reshape(qx.shape)
        return F.linear(xr, self.dequantize()).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        b, g, lanes, four = self.packed.shape
        q = self.packed.permute(0, 2, 1, 3).reshape(b * lanes, g * four).to(torch.int16) - 128
        return q.float() * self.scale[:, None]

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * 4

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale.numel() * 4

    def native_mat(self) -> Mat | None:
        if self.native is None or not self.native.vnni:
            return None
        n, k = self.scale.shape[0], self.in_features
        return Mat(self.packed.data_ptr(), self.scale.data_ptr(), None, None, n, k, MAT_W8A8)


FORMATS = {"none": Dense, "bf16": Bf16, "int8": Int8, "int4": Int4, "w8a8": W8A8}


def pack(name: str, w: torch.Tensor, dtype: torch.dtype,
         native: NativeKernels | None = None) -> WeightFormat:
    """The weight ``w`` [N, K] in format ``name``, for activations of ``dtype``; ``native``
    kernels serve the formats that have a native path (int8, int4, w8a8)."""
    if name == "none":
        return Dense(w.to(dtype))
    if name == "bf16":
        return Bf16(w.to(torch.bfloat16).contiguous())
    if name == "int8":
        return Int8.from_float(w, dtype, native)
    if name == "int4":
        return Int4.from_float(w, dtype, native=native)
    if name == "w8a8":
        return W8A8.from_float(w, dtype, native)
    return FORMATS[name].from_float(w, dtype)
