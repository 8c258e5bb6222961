"""The native int8 GEMV against torch on the dequantized weight, built for this CPU and for
the scalar (no-AVX2) path; and the pure-torch fallback when the build cannot happen."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from shared.worker.native.build import NativeKernels, build, isa_flags, load_native
from shared.worker.quant.formats import pack


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native")


@pytest.mark.parametrize("flags", ["this-cpu", "scalar"])
@pytest.mark.parametrize("rows,k", [(1, 576), (3, 100), (8, 1536), (5, 64)])   # 100: a K off the SIMD width
def test_int8_gemm_small_matches_torch(cache: Path, flags: str, rows: int, k: int) -> None:
    kernels = NativeKernels(build(cache, isa_flags() if flags == "this-cpu" else []))
    assert kernels.isa == ("scalar" if flags == "scalar" else kernels.isa)
    g = torch.Generator().manual_seed(rows)
    w = pack("int8", torch.randn(203, k, generator=g) * 0.05, torch.float32)
    x = torch.randn(rows, k, generator=g)
    got = kernels.int8_gemm_small(x, w.qweight, w.scale_f32, num_threads=2)
    ref = x @ (w.qweight.float() * w.scale_f32[:, None]).t()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_int8_format_takes_the_native_path_for_small_float32_batches(cache: Path) -> None:
    native = load_native(cache)
    assert native is not None
    w = torch.randn(64, 128) * 0.05
    fmt, plain = pack("int8", w, torch.float32, native), pack("int8", w, torch.float32)
    for rows in (1, 8, 9):           # 9 rows: torch's kernel (bf16) again
        x = torch.randn(rows, 128)
        torch.testing.assert_close(fmt.matmul(x), plain.matmul(x), atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="at most 8"):
        native.int8_gemm_small(torch.randn(9, 128), fmt.qweight, fmt.scale_f32, 1)


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
