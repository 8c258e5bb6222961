"""int4 weights: GGUF Q4_1-layout blocks for the native kernels (q4.c; q4v.c's repacking of them
where the CPU has AVX512-VNNI), torch's int4 pack built from them for larger batches (see
formats.py for the other formats)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from shared.worker.native.abi import MAT_Q4, MAT_Q4V, MAX_Q4_GROUPS, Q4_GROUP, Mat

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
class Q4VBlocks:
    """The same numbers in q4v.c's 16-row blocks (see its header): one 64-byte vector is 4
    consecutive input channels (and the 4 sixteen channels on) of 16 output rows."""

    packed: torch.Tensor                # uint8 [N / 16, K / 32, 4, 16, 4]
    scale_zero: torch.Tensor            # float16 [N / 16, K / 32, 2, 16]
    mat: Mat = field(init=False, repr=False)

    def __post_init__(self) -> None:
        blocks, groups = self.packed.shape[:2]
        self.mat = Mat(self.packed.data_ptr(), self.scale_zero.data_ptr(), None, None,
                       16 * blocks, Q4_GROUP * groups, MAT_Q4V)

    @classmethod
    def from_blocks(cls, b: Q4Blocks) -> Q4VBlocks:
        n, g = b.scale.shape
        pairs = b.packed.view(n, g, 16)
        q = torch.cat([pairs & 15, pairs >> 4], dim=-1)                       # [N, G, 32]
        q = q.view(n // 16, 16, g, 8, 4).permute(0, 2, 3, 1, 4)              # [B, G, 8, 16, 4]
        packed = (q[:, :, :4] | (q[:, :, 4:] << 4)).contiguous()
        sz = torch.stack([t.view(n // 16, 16, g).permute(0, 2, 1) for t in (b.scale, b.zero)], dim=2)
        return cls(packed, sz.contiguous())

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * self.scale_zero.numel()


@dataclass
class Int4:
    """The weight as Q4 blocks. Where the native kernels have VNNI, float32 batches of any size
    run q4v.c on a repacked copy (the blocks stay for the cache and the exactness check);
    elsewhere batches of up to ``native.max_rows`` rows run q4.c, and the rest torch's int4
    kernel on a pack built from the same blocks on first use (a decode-only int4 under ``auto``
    never builds it)."""

    blocks: Q4Blocks
    native: NativeKernels | None = None
    num_threads: int = 1
    name: str = "int4"
    _torch_pack: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    vnni: Q4VBlocks | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.vnni is None and self.native is not None and self.native.vnni:
            self.vnni = Q4VBlocks.from_blocks(self.blocks)

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
        if self.vnni is not None and native is not None and x.dtype == torch.float32:
            return native.gemm_w8a8(self.vnni.mat, x, self.num_threads)
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
        return self.blocks.nbytes + extra + (0 if self.vnni is None else self.vnni.nbytes)

    def native_mat(self) -> Mat | None:
        if self.native is None:
            return None
        return self.blocks.mat if self.vnni is None else self.vnni.mat
