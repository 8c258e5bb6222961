"""The VNNI int4 kernel (q4v.c) against torch: activations rounded to int8 per group of 32 times
the Q4_1 blocks' q * d, plus their zero points times the exact activation sums, for this CPU's build, AVX-512 without VNNI and the scalar build
(which check the repacked layout on any CPU); which kernel the int4 format routes to."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.worker.native.abi import MAT_Q4, MAT_Q4V
from shared.worker.native.build import NativeKernels, build, isa_flags
from shared.worker.quant.formats import quantize_groups
from shared.worker.quant.int4 import Int4, Q4Blocks, Q4VBlocks

BUILDS = ["this-cpu", "scalar"] + (["avx512-no-vnni"] if "-mavx512vnni" in isa_flags() else [])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native-q4v")


def kernels_for(cache: Path, name: str) -> NativeKernels:
    flags = {"this-cpu": isa_flags(), "scalar": [], "avx512-no-vnni": isa_flags("AVX512")}[name]
    return NativeKernels(build(cache, flags))


def rounded(x: torch.Tensor) -> torch.Tensor:
    qx, sx = quantize_groups(x)
    return (qx.float().reshape(*sx.shape, 32) * sx[..., None]).reshape(x.shape)


def reference(x: torch.Tensor, blocks: Q4Blocks) -> torch.Tensor:
    """The rounded activations times q * d, plus the zero points times the exact float sums."""
    zeros = blocks.zero.float().repeat_interleave(32, dim=1)
    return rounded(x) @ (blocks.dequantize() - zeros).t() + x @ zeros.t()


# n: 13 blocks of 16 = 6 register panels of 2 blocks + 1 over; 16: only the block over.
# rows: tiles of 4 rows leave 0-3 over; 65 and 130 are past the small-batch kernels' 64.
CASES = [(1, 208, 576), (2, 16, 32), (3, 32, 96), (5, 208, 1536), (6, 48, 64), (65, 64, 576),
         (130, 208, 96)]


@pytest.mark.parametrize("build_name", BUILDS)
@pytest.mark.parametrize("rows,n,k", CASES)
def test_kernel_matches_rounded_activations_times_the_blocks(
        cache: Path, build_name: str, rows: int, n: int, k: int) -> None:
    kernels = kernels_for(cache, build_name)
    g = torch.Generator().manual_seed(rows * n + k)
    blocks = Q4Blocks.from_float(torch.randn(n, k, generator=g) * 0.05)
    vnni = Q4VBlocks.from_blocks(blocks)
    x = torch.randn(rows, k, generator=g) * 2
    x[0, 5] = 40.0                             # an outlier channel: only its group's scale grows
    ref = reference(x, blocks)
    torch.testing.assert_close(kernels.gemm_w8a8(vnni.mat, x, num_threads=2), ref,
                               atol=1e-4, rtol=1e-4)
    if rows <= kernels.max_rows:               # the fused decode step's entry (gemv_for)
        torch.testing.assert_close(kernels.gemm_small(vnni.mat, x, 3), ref, atol=1e-4, rtol=1e-4)


def test_repacking_keeps_every_weight_and_its_scales() -> None:
    blocks = Q4Blocks.from_float(torch.randn(32, 64))
    vnni = Q4VBlocks.from_blocks(blocks)
    q = torch.cat([blocks.packed.view(32, 2, 16) & 15, blocks.packed.view(32, 2, 16) >> 4], -1)
    # row 17 = block 1, lane 1; input channel 32 + 4 * 2 + 3 (group 1, vector 2, byte 3, low) and
    # the one 16 further on (the same byte's high nibble)
    byte = int(vnni.packed[1, 1, 2, 1, 3])
    assert byte & 15 == int(q[17, 1, 11]) and byte >> 4 == int(q[17, 1, 27])
    assert vnni.scale_zero[1, 1, 0, 1] == blocks.scale[17, 1]
    assert vnni.scale_zero[1, 1, 1, 1] == blocks.zero[17, 1]
    assert vnni.nbytes == blocks.nbytes == 32 * 64 * 5 // 8


def test_int4_runs_q4v_only_where_the_kernels_have_vnni(cache: Path) -> None:
    kernels = kernels_for(cache, "this-cpu")
    w = torch.randn(96, 128) * 0.05
    fmt = Int4.from_float(w, torch.float32, kernels)
    assert fmt.native_mat().kind == (MAT_Q4V if kernels.vnni else MAT_Q4)
    assert (fmt.vnni is not None) == kernels.vnni
    without = Int4.from_float(w, torch.float32, kernels_for(cache, "avx512-no-vnni")
                              if "avx512-no-vnni" in BUILDS else kernels_for(cache, "scalar"))
    assert without.vnni is None and without.native_mat().kind == MAT_Q4
    for rows in (1, 7, 200):                   # 200: past q4.c's 64 rows, still q4v.c with VNNI
        x = torch.randn(rows, 128)
        ref = reference(x, fmt.blocks) if kernels.vnni else x @ fmt.dequantize().t()
        tol = 1e-4 if kernels.vnni else 3e-2   # without VNNI, 200 rows run torch's bf16 kernel
        torch.testing.assert_close(fmt.matmul(x), ref, atol=tol, rtol=tol)
