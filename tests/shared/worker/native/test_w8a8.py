"""The W8A8 kernel (w8a8.c) against torch: activations rounded to int8 per group of 32 times the
dequantized weight, for this CPU's build (VNNI where it has it), AVX-512 without VNNI and the
scalar build; the format's torch path against the kernel; shapes it refuses."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.worker.native.abi import MAT_W8A8, Mat
from shared.worker.native.build import NativeKernels, build, isa_flags
from shared.worker.quant.formats import W8A8, quantize_groups

BUILDS = ["this-cpu", "scalar"] + (["avx512-no-vnni"] if "-mavx512vnni" in isa_flags() else [])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native-w8a8")


def kernels_for(cache: Path, name: str) -> NativeKernels:
    flags = {"this-cpu": isa_flags(), "scalar": [], "avx512-no-vnni": isa_flags("AVX512")}[name]
    return NativeKernels(build(cache, flags))


def mat_of(fmt: W8A8, bias: torch.Tensor | None = None) -> Mat:
    n, k = fmt.scale.shape[0], fmt.in_features
    return Mat(fmt.packed.data_ptr(), fmt.scale.data_ptr(), None,
               None if bias is None else bias.data_ptr(), n, k, MAT_W8A8)


def reference(x: torch.Tensor, fmt: W8A8) -> torch.Tensor:
    qx, sx = quantize_groups(x)
    xr = (qx.float().reshape(*sx.shape, 32) * sx[..., None]).reshape(x.shape)
    return xr @ fmt.dequantize().t()


# n: 13 blocks of 16 = 4 register panels of 3 blocks + 1 over; 16 and 32: only the blocks over.
# rows: tiles of 4 rows leave 0-3 over; 65 and 130 are past the small-batch kernels' 64.
CASES = [(1, 208, 576), (2, 16, 32), (3, 32, 96), (5, 208, 1536), (6, 48, 64), (13, 208, 192),
         (65, 64, 576), (130, 208, 96)]


@pytest.mark.parametrize("build_name", BUILDS)
@pytest.mark.parametrize("rows,n,k", CASES)
def test_kernel_matches_rounded_activations_times_dequantized_weight(
        cache: Path, build_name: str, rows: int, n: int, k: int) -> None:
    kernels = kernels_for(cache, build_name)
    g = torch.Generator().manual_seed(rows * n + k)
    fmt = W8A8.from_float(torch.randn(n, k, generator=g) * 0.05, torch.float32)
    x = torch.randn(rows, k, generator=g) * 2
    x[0, 5] = 40.0                             # an outlier channel: only its group's scale grows
    bias = torch.randn(n, generator=g)
    ref = reference(x, fmt)
    got = kernels.gemm_w8a8(mat_of(fmt), x, num_threads=2)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    with_bias = kernels.gemm_w8a8(mat_of(fmt, bias), x, num_threads=3)
    torch.testing.assert_close(with_bias, ref + bias, atol=1e-4, rtol=1e-4)
    if rows <= kernels.max_rows:               # the fused decode step's entry (gemv_for)
        torch.testing.assert_close(kernels.gemm_small(mat_of(fmt), x, 2), ref, atol=1e-4, rtol=1e-4)


def test_kernel_refuses_weights_off_its_blocks(cache: Path) -> None:
    kernels = kernels_for(cache, "this-cpu")
    fmt = W8A8.from_float(torch.randn(32, 64), torch.float32)
    bad = mat_of(fmt)
    bad.n = 24
    with pytest.raises(ValueError, match="gemm_w8a8"):
        kernels.gemm_w8a8(bad, torch.randn(2, 64), 1)


def test_format_routes_to_the_kernel_only_with_vnni(cache: Path) -> None:
    kernels = kernels_for(cache, "this-cpu")
    w = torch.randn(96, 128) * 0.05
    native, plain = W8A8.from_float(w, torch.float32, kernels), W8A8.from_float(w, torch.float32)
    assert plain.native_mat() is None
    assert (native.native_mat() is not None) == kernels.vnni
    for rows in (1, 7, 200):
        x = torch.randn(rows, 128)
        torch.testing.assert_close(native.matmul(x), plain.matmul(x), atol=1e-4, rtol=1e-4)
        y16 = native.matmul(x.to(torch.bfloat16))       # bf16 activations: cast around it
        assert y16.dtype == torch.bfloat16
        torch.testing.assert_close(y16.float(), plain.matmul(x), atol=3e-2, rtol=3e-2)


def test_blocks_round_trip_the_int8_weight() -> None:
    w = torch.randn(48, 64)
    fmt = W8A8.from_float(w, torch.float32)
    scale = w.abs().amax(1) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127)
    torch.testing.assert_close(fmt.dequantize(), q * scale[:, None], atol=1e-6, rtol=0)
    assert fmt.nbytes == 48 * 64 + 48 * 4
