"""The native GEMV (float32, int8, Q4 blocks) against torch on the dequantized weight, built for
this CPU and for the scalar (no-AVX2) path; and the pure-torch fallback when the build cannot
happen."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from shared.worker.native.build import NativeKernels, build, isa_flags, load_native
from shared.worker.quant.formats import WeightFormat, pack
from shared.worker.quant.int4 import Q4Blocks


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native")


def native_weight(kind: str, w: torch.Tensor, native: NativeKernels) -> tuple[WeightFormat, torch.Tensor]:
    """(w in ``kind``, the float weight its C view stands for)."""
    if kind == "f32":
        return pack("none", w, torch.float32), w
    fmt = pack(kind, w, torch.float32, native)
    if kind == "int4":
        return fmt, fmt.blocks.dequantize()
    return fmt, fmt.qweight.float() * fmt.scale_f32[:, None]     # the float32 scales


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 per group of 32 (scale max|x| / 127), as the integer-dot kernels see it."""
    xg = x.reshape(x.shape[0], -1, 32)
    step = xg.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xg / step.clamp(min=1e-30)) * step).reshape_as(x)


def reference(kind: str, x: torch.Tensor, fmt: WeightFormat, weight: torch.Tensor, isa: str) -> torch.Tensor:
    """What the kernel computes. With SIMD, Q4 always and int8 at one or two rows multiply
    int8-rounded activations (Q4's zero points times the exact float sums)."""
    simd = isa != "scalar"
    if kind == "int4" and simd:
        zeros = fmt.blocks.zero.float().repeat_interleave(32, dim=1)
        return rounded(x) @ (weight - zeros).t() + x @ zeros.t()
    if kind == "int8" and simd and x.shape[0] <= 2 and x.shape[1] % 32 == 0:
        return rounded(x) @ weight.t()
    return x @ weight.t()


# 100: off the SIMD width; 45 rows: two chunks of Q4 activations. 3 rows and up run register
# tiles of 4 rows x 3 weight rows: 3, 5, 6 and 13 rows leave 3, 1, 2 and 1 rows over, and
# 206 + rows % 3 weight rows leave 0-2 (not int4)
SHAPES = [(1, 576), (2, 64), (3, 96), (8, 1536), (5, 64), (6, 96), (2, 100), (13, 192), (32, 576),
          (45, 192)]
CASES = [(kind, rows, k) for kind in ("f32", "int8", "int4") for rows, k in SHAPES
         if kind != "int4" or k % 32 == 0]                       # int4 needs whole groups of 32


@pytest.mark.parametrize("flags", ["this-cpu", "scalar"])
@pytest.mark.parametrize("kind,rows,k", CASES)
def test_gemm_small_matches_torch(cache: Path, flags: str, kind: str, rows: int, k: int) -> None:
    kernels = NativeKernels(build(cache, isa_flags() if flags == "this-cpu" else []))
    assert kernels.isa == ("scalar" if flags == "scalar" else kernels.isa)
    g = torch.Generator().manual_seed(rows)
    n = 208 if kind == "int4" else 206 + rows % 3       # int4 packs 16 output rows at a time
    fmt, weight = native_weight(kind, torch.randn(n, k, generator=g) * 0.05, kernels)
    x = torch.randn(rows, k, generator=g)
    ref = reference(kind, x, fmt, weight, kernels.isa)
    torch.testing.assert_close(kernels.gemm_small(fmt.native_mat(), x, num_threads=2), ref,
                               atol=1e-4, rtol=1e-4)


def test_q4_blocks_round_trip_a_q4_checkpoint_exactly() -> None:
    # Weights that were themselves 4-bit blocks (q * d + z, float16 d and z) come back unchanged.
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (32, 4, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15                        # every block spans its whole range
    d = (torch.rand(32, 4, 1, generator=g) * 0.01).half().float()
    z = (-8 * d + torch.randn(32, 4, 1, generator=g) * 1e-3).half().float()
    w = (q * d + z).reshape(32, 128)
    assert torch.equal(Q4Blocks.from_float(w).dequantize(), w)
    # A float weight loses at most half a step per group.
    f = torch.randn(32, 128, generator=g)
    blocks = Q4Blocks.from_float(f)
    err = (blocks.dequantize() - f).abs().reshape(32, 4, 32).amax(-1)
    assert (err <= blocks.scale.float() * 0.5 + 1e-3).all()


def test_formats_take_the_native_path_for_small_float32_batches(cache: Path) -> None:
    native = load_native(cache)
    assert native is not None
    w = torch.randn(64, 128) * 0.05
    for kind in ("int8", "int4"):
        fmt, exact = native_weight(kind, w, native)
        for rows in (1, 8, 40, native.max_rows):        # the native kernel (Q4: chunks of 32 rows)
            x = torch.randn(rows, 128)
            ref = reference(kind, x, fmt, exact, native.isa)
            torch.testing.assert_close(fmt.matmul(x), ref, atol=1e-4, rtol=1e-4)
        x = torch.randn(native.max_rows + 1, 128)       # torch's kernel on bf16 activations
        torch.testing.assert_close(fmt.matmul(x), x @ fmt.dequantize().t(), atol=3e-2, rtol=3e-2)
    fmt = pack("int8", w, torch.float32)
    with pytest.raises(ValueError, match=f"at most {native.max_rows}"):
        native.gemm_small(fmt.native_mat(), torch.randn(native.max_rows + 1, 128), 1)


def test_the_build_is_cached_and_keyed(cache: Path) -> None:
    first = build(cache)
    assert build(cache) == first and first.exists()
    assert build(cache, []) != first or isa_flags() == []


def test_no_compiler_falls_back_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))
    with caplog.at_level(logging.WARNING):
        assert load_native(tmp_path) is None
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "pure-torch path" in caplog.records[0].getMessage()


def test_native_off_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINSERVE_NATIVE", "0")
    assert load_native(tmp_path) is None
