"""int4 weights: GGUF Q4_1-layout blocks for the native kernel, torch's int4 pack built from
them for larger batches (see formats.py for the other formats)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from shared.worker.native.abi import MAT_Q4, MAX_Q4_GROUPS, Q4_GROUP, Mat

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

KERNEL_DTYPE = torch.bfloat16     # what torch's weight-only CPU kernels (int8, int4) multiply


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
