"""Each quantized matmul against the float matmul of its own dequantized weight, so the
kernel's error and the quantization's error are checked separately (tolerances per format)."""
from __future__ import annotations

import pytest
import torch

from shared.worker.quant.formats import (
    KERNEL_DTYPE,
    W8A8,
    Dense,
    Int4,
    Int8,
    bucket_rows,
    pack,
    quantize_groups,
)

# Relative to the output's scale: the kernel alone (dequantized weight as the reference).
KERNEL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# Quantization error of the weight itself, relative to its row's largest entry; the weight-only
# formats keep their scales in KERNEL_DTYPE (bf16: 2^-8 relative rounding on top).
BF16_EPS = 2 ** -8
QUANT_TOL = {"none": 0.0, "int8": 1 / 254 + BF16_EPS, "w8a8": 1 / 254 + 1e-6}


def _weight(n: int = 96, k: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[3, 7] = 0.9                  # an outlier: per-channel scales must contain it
    return w


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["none", "int8", "int4", "w8a8"])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_matmul_matches_its_dequantized_weight(name: str, dtype: torch.dtype, rows: int) -> None:
    w = _weight()
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(1)).to(dtype)
    fmt = pack(name, w, dtype)
    y = fmt.matmul(x)
    assert y.dtype == dtype and y.shape == (rows, w.shape[0])
    xr = x.float()
    if name == "w8a8":             # its activations are quantized too: the reference is exact ints
        qx, sx = quantize_groups(x)          # per group of 32 along the input
        xr = (qx.float().reshape(rows, -1, 32) * sx[..., None]).reshape(rows, -1)
    ref = xr @ fmt.dequantize().t()
    # The weight-only kernels multiply in KERNEL_DTYPE whatever the activations' dtype.
    kernel_dtype = KERNEL_DTYPE if name in ("int8", "int4") else dtype
    assert _rel(y.float(), ref) < max(KERNEL_TOL[dtype], KERNEL_TOL[kernel_dtype])


@pytest.mark.parametrize("name", ["none", "int8", "int4", "w8a8"])
def test_dequantized_weight_is_close(name: str) -> None:
    w = _weight()
    fmt = pack(name, w, torch.float32)
    err = (fmt.dequantize() - w).abs()
    if name == "int4":             # per group of 32: the bound is each group's own range / 30
        groups = w.reshape(w.shape[0], -1, 32)
        span = (groups.amax(-1) - groups.amin(-1)).repeat_interleave(32, dim=1)
        # (q - 8) * s + z with s and z rounded to bf16: at most 8 |ds| + |dz| more
        assert (err <= span / 30 + (span / 15 * 8 + w.abs()).mul(BF16_EPS) + 1e-6).all()
    else:                          # per output channel: each row's absmax / 254
        assert (err <= w.abs().amax(1, keepdim=True) * QUANT_TOL[name] + 1e-7).all()


def test_formats_are_smaller_than_bf16() -> None:
    w = _weight(256, 256)
    dense = pack("none", w, torch.bfloat16).nbytes
    assert isinstance(pack("none", w, torch.bfloat16), Dense)
    assert pack("int8", w, torch.bfloat16).nbytes < 0.55 * dense
    assert pack("int4", w, torch.bfloat16).nbytes < 0.35 * dense
    assert isinstance(pack("int8", w, torch.bfloat16), Int8)
    assert isinstance(pack("int4", w, torch.bfloat16), Int4)
    assert isinstance(pack("w8a8", w, torch.bfloat16), W8A8)


def test_int4_refuses_in_features_off_the_group_size() -> None:
    with pytest.raises(ValueError, match="group size"):
        pack("int4", torch.randn(8, 40), torch.float32)


@pytest.mark.parametrize("shape", [(24, 64), (16, 40)])
def test_w8a8_refuses_shapes_off_its_blocks(shape: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="w8a8 needs"):
        W8A8.from_float(torch.randn(*shape), torch.float32)


def test_zero_rows_and_zero_weights_stay_finite() -> None:
    w = torch.zeros(16, 64)
    x = torch.zeros(2, 64)
    for name in ("int8", "int4", "w8a8"):
        y = pack(name, w, torch.float32).matmul(x)
        assert torch.isfinite(y).all() and (y == 0).all(), name


def test_bucket_rows_pads_at_most_an_eighth_past_128_rows() -> None:
    assert [bucket_rows(m) for m in (1, 77, 128)] == [1, 77, 128]
    buckets = {bucket_rows(m) for m in range(129, 1025)}
    assert len(buckets) <= 32                    # a bounded set of GEMM shapes for oneDNN
    for m in range(129, 4097):
        assert m <= bucket_rows(m) <= m * 1.125
    assert bucket_rows(1024) == 1024 and bucket_rows(1000) == 1024 and bucket_rows(129) == 144


@pytest.mark.parametrize("fmt_name", ["bf16", "dense-bf16"])
@pytest.mark.parametrize("rows", [129, 200, 256])
def test_padded_bf16_rows_give_the_unpadded_product(fmt_name: str, rows: int) -> None:
    w = _weight(n=64, k=96)
    dtype = torch.float32 if fmt_name == "bf16" else torch.bfloat16
    fmt = pack("bf16", w, dtype) if fmt_name == "bf16" else Dense(w.bfloat16())
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = fmt.matmul(x)
    assert y.dtype == dtype and y.shape == (rows, 64) and y.is_contiguous()
    ref = x.bfloat16().float() @ fmt.dequantize().t()
    assert _rel(y.float(), ref) < KERNEL_TOL[torch.bfloat16]
    # every row its own: a padded row shifted into the result would break the last rows
    assert _rel(y[-1:].float(), ref[-1:]) < KERNEL_TOL[torch.bfloat16]
